// The models of sparse_ctr on a batch's pulled rows, and the metrics.
// Logistic regression: logit = sum of the weights of a sample's ids (its
// kFields feature ids and the bias id). Factorization machine (Rendle 2010):
// plus sum over pairs i < j of <v_i, v_j>, each id's v a row of fm_dim
// floats, computed as 0.5 * sum_f ((sum_i v_if)^2 - sum_i v_if^2).
//
// Rows and slots are SparseBatch's: the batch's ids are sample-major,
// kIdsPerSample per sample; slot[i] is id i's row among the unique ones.
// Pure functions; any thread.
#ifndef PS_EXAMPLES_SPARSE_CTR_MODEL_H_
#define PS_EXAMPLES_SPARSE_CTR_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ctr_data.h"

namespace ctr {

constexpr int kIdsPerSample = kFields + 1;  // the fields', then the bias

// Appends samples [begin, end)'s ids and the bias id, kIdsPerSample each.
void BatchIds(const Samples& s, size_t begin, size_t end,
              std::vector<uint64_t>* ids);

struct ModelRows {
  const float* linear = nullptr;   // unique ids x 1
  const float* factors = nullptr;  // unique ids x fm_dim; null: LR
  int fm_dim = 0;
};

// Logits of `n` samples into logits[0, n).
void Logits(const ModelRows& rows, const uint32_t* slot, size_t n,
            float* logits);

// Logits and, per unique id, the sum over the batch of d logloss / d row
// (grad_linear: unique x 1; grad_factors: unique x fm_dim, when FM), both
// zeroed first. Returns the batch's summed logloss.
double Gradients(const ModelRows& rows, const uint32_t* slot, size_t n,
                 const float* labels, float* grad_linear, float* grad_factors,
                 size_t unique);

// log(1 + e^-z) for label 1, log(1 + e^z) for 0, without overflow.
double LogLoss(float logit, float label);

// Area under the ROC curve of `scores` for `labels` (rank statistic, tied
// scores counted half); 0.5 when a class is absent.
double Auc(const std::vector<float>& scores, const std::vector<float>& labels);

}  // namespace ctr

#endif  // PS_EXAMPLES_SPARSE_CTR_MODEL_H_
