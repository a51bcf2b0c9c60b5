// Logistic regression and the factorization machine on pulled rows, AUC
// and logloss (ctr_model.h).
#include "ctr_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ctr {

namespace {

// The FM term of one sample, and each factor's sum over its ids in sum[].
double FmTerm(const ModelRows& rows, const uint32_t* slot, float* sum) {
  const int d = rows.fm_dim;
  double squares = 0;
  std::fill(sum, sum + d, 0.0f);
  for (int k = 0; k < kIdsPerSample; ++k) {
    const float* v = rows.factors + static_cast<size_t>(slot[k]) * d;
    for (int f = 0; f < d; ++f) {
      sum[f] += v[f];
      squares += static_cast<double>(v[f]) * v[f];
    }
  }
  double total = 0;
  for (int f = 0; f < d; ++f) total += static_cast<double>(sum[f]) * sum[f];
  return 0.5 * (total - squares);
}

double LinearTerm(const ModelRows& rows, const uint32_t* slot) {
  double z = 0;
  for (int k = 0; k < kIdsPerSample; ++k) z += rows.linear[slot[k]];
  return z;
}

}  // namespace

void BatchIds(const Samples& s, size_t begin, size_t end,
              std::vector<uint64_t>* ids) {
  const uint64_t bias = BiasId();
  for (size_t i = begin; i < end; ++i) {
    ids->insert(ids->end(), s.ids.begin() + i * kFields,
                s.ids.begin() + (i + 1) * kFields);
    ids->push_back(bias);
  }
}

void Logits(const ModelRows& rows, const uint32_t* slot, size_t n,
            float* logits) {
  std::vector<float> sum(static_cast<size_t>(rows.fm_dim));
  for (size_t i = 0; i < n; ++i) {
    const uint32_t* s = slot + i * kIdsPerSample;
    double z = LinearTerm(rows, s);
    if (rows.factors != nullptr) z += FmTerm(rows, s, sum.data());
    logits[i] = static_cast<float>(z);
  }
}

double Gradients(const ModelRows& rows, const uint32_t* slot, size_t n,
                 const float* labels, float* grad_linear, float* grad_factors,
                 size_t unique) {
  const int d = rows.fm_dim;
  std::fill(grad_linear, grad_linear + unique, 0.0f);
  if (rows.factors != nullptr) {
    std::fill(grad_factors, grad_factors + unique * d, 0.0f);
  }
  std::vector<float> sum(static_cast<size_t>(d));
  double loss = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t* s = slot + i * kIdsPerSample;
    double z = LinearTerm(rows, s);
    if (rows.factors != nullptr) z += FmTerm(rows, s, sum.data());
    const float logit = static_cast<float>(z);
    loss += LogLoss(logit, labels[i]);
    const float g = 1.0f / (1.0f + std::exp(-logit)) - labels[i];
    for (int k = 0; k < kIdsPerSample; ++k) grad_linear[s[k]] += g;
    if (rows.factors == nullptr) continue;
    // d term / d v_kf = sum_f - v_kf.
    for (int k = 0; k < kIdsPerSample; ++k) {
      const size_t row = static_cast<size_t>(s[k]) * d;
      for (int f = 0; f < d; ++f) {
        grad_factors[row + f] += g * (sum[f] - rows.factors[row + f]);
      }
    }
  }
  return loss;
}

double LogLoss(float logit, float label) {
  const double z = label > 0.5f ? -logit : logit;
  return z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z));
}

double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  const size_t n = scores.size();
  for (float s : scores) {
    if (std::isnan(s)) return std::nan("");  // no order to rank by
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double rank_sum = 0, positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && scores[order[j]] == scores[order[i]]) ++j;
    const double mid_rank = 0.5 * (i + 1 + j);  // ranks i+1..j, averaged
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        rank_sum += mid_rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace ctr
