"""A synthetic stand-in for Criteo's click logs, made in memory from a seed.

Each sample has one id in each of len(FIELDS) categorical fields (field f's
ids are ranks [0, FIELDS[f]) drawn from a Zipf law of exponent ZIPF, then
hashed over the 64-bit range as hashed Criteo features are), a bag of 1 to
5 "tags" from their own Zipf vocabulary, and DENSE normal dense features.
Its label is drawn from a planted factorization machine: a weight and a
K-vector per (field, rank), and

    logit = BIAS + sum of the sample's weights (the tags' mean) + x . beta
            + sum over pairs of its vectors (the tags' mean) of their dot

so the planted logit's own AUC on a test set is the ceiling of any model
(planted_logits). The planted model depends on the seed only; train and
test samples are drawn from it with different streams.
"""

import numpy as np
import torch

FIELDS = (20, 100, 1000, 5000, 20000, 100000, 500, 3000)
TAGS = 2000  # the tags' vocabulary
DENSE = 4
K = 4  # planted vectors' width
ZIPF = 1.1
BIAS = -1.8
WEIGHT_SD, VECTOR_SD, BETA_SD = 0.5, 0.3, 0.3


def splitmix64(x):
    """splitmix64's finalizer over a uint64 array: distinct inputs give
    distinct, well-spread 64-bit ids."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hashed_ids(field, ranks):
    """The 64-bit ids of `ranks` of `field` (len(FIELDS): the tags), as
    int64 (torch's index type; the same bits)."""
    x = (np.uint64(field + 1) << np.uint64(40)) | ranks.astype(np.uint64)
    return splitmix64(x).view(np.int64)


def zipf(rng, vocab, n):
    p = 1.0 / np.arange(1, vocab + 1) ** ZIPF
    return rng.choice(vocab, size=n, p=p / p.sum())


class Planted:
    """The planted model's weights and vectors, from `seed`."""

    def __init__(self, seed):
        rng = np.random.default_rng([seed, 0])
        sizes = list(FIELDS) + [TAGS]
        self.w = [rng.normal(0, WEIGHT_SD, v) for v in sizes]
        self.u = [rng.normal(0, VECTOR_SD, (v, K)) for v in sizes]
        self.beta = rng.normal(0, BETA_SD, DENSE)


class Synthetic:
    """n samples of split "train" or "test": ids [n, F] (int64), the tags'
    ids (flat) with each sample's start, dense [n, DENSE], labels, and the
    planted logits."""

    def __init__(self, seed, n, split="train"):
        planted = Planted(seed)
        rng = np.random.default_rng([seed, 1 if split == "train" else 2])
        self.n = n
        ranks = np.stack([zipf(rng, v, n) for v in FIELDS], axis=1)
        self.ids = np.stack([hashed_ids(f, ranks[:, f])
                             for f in range(len(FIELDS))], axis=1)
        counts = rng.integers(1, 6, n)
        self.tag_start = np.concatenate([[0], np.cumsum(counts)])
        tag_ranks = zipf(rng, TAGS, int(self.tag_start[-1]))
        self.tag_ids = hashed_ids(len(FIELDS), tag_ranks)
        self.dense = rng.normal(0, 1, (n, DENSE)).astype(np.float32)

        # The planted logit: first-order terms, then the pairwise dots.
        sample = np.repeat(np.arange(n), counts)
        tag_w = np.bincount(sample, planted.w[-1][tag_ranks], n) / counts
        tag_u = np.stack([np.bincount(sample, planted.u[-1][tag_ranks, k], n)
                          for k in range(K)], axis=1) / counts[:, None]
        logit = BIAS + tag_w + self.dense @ planted.beta
        vecs = [planted.u[f][ranks[:, f]] for f in range(len(FIELDS))]
        vecs.append(tag_u)
        for f in range(len(FIELDS)):
            logit += planted.w[f][ranks[:, f]]
        total = np.sum(vecs, axis=0)  # sum of pairs = (|sum|^2 - sum |v|^2)/2
        logit += 0.5 * ((total ** 2).sum(1) -
                        sum((v ** 2).sum(1) for v in vecs))
        self.planted_logits = logit
        self.labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(
            np.float32)

    def batch(self, lo, hi):
        """Samples [lo, hi) as torch tensors: (ids [B, F], tags 1-D, tag
        offsets [B], dense [B, DENSE], labels [B])."""
        a, b = self.tag_start[lo], self.tag_start[hi]
        return (torch.from_numpy(self.ids[lo:hi]),
                torch.from_numpy(self.tag_ids[a:b]),
                torch.from_numpy(self.tag_start[lo:hi] - a),
                torch.from_numpy(self.dense[lo:hi]),
                torch.from_numpy(self.labels[lo:hi]))
