"""The tutorial's MNIST network and data, shared by the PyTorch trainers.

Net is PyTorch's examples/mnist Net exactly (conv1 1->32 3x3, conv2 32->64
3x3, max-pool 2, dropout 0.25, fc1 9216->128, dropout 0.5, fc2 128->10,
log-softmax; 1,199,882 parameters). The data are the IDX files (read with
NumPy, nothing downloaded), normalised with mean 0.1307 and std 0.3081.
"""

import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.1307, 0.3081


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def read_idx(path):
    """An IDX file (uncompressed) as a NumPy array of its shape."""
    with open(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
            for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_mnist(data_dir, train, limit=0):
    """(images float32 [N,1,28,28] normalised, labels int64 [N])."""
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.astype(np.float32) / 255.0)
    x = ((x - MEAN) / STD).unsqueeze(1).contiguous()
    return x, torch.from_numpy(labels.astype(np.int64))


def num_images(data_dir, train, limit=0):
    """How many images load_mnist would load, from the labels file's
    header alone."""
    prefix = "train" if train else "t10k"
    with open(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"),
              "rb") as f:
        n = int.from_bytes(f.read(8)[4:8], "big")
    return min(n, limit) if limit else n


def shard_batches(n, batch_size, rank, world, epoch, seed):
    """This rank's batches of one epoch: a seeded shuffle of [0, n) cut in
    `world` equal shards, then in batches (the last partial batch dropped, so
    every rank runs the same number of steps)."""
    g = torch.Generator()
    g.manual_seed(seed * 1000 + epoch)
    order = torch.randperm(n, generator=g)
    per = n // world
    mine = order[rank * per:(rank + 1) * per]
    steps = per // batch_size
    return [mine[i * batch_size:(i + 1) * batch_size] for i in range(steps)]


@torch.no_grad()
def evaluate(model, x, y, batch_size=1000):
    """(accuracy, mean NLL loss) on x, y."""
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, len(x), batch_size):
        out = model(x[i:i + batch_size])
        loss += F.nll_loss(out, y[i:i + batch_size], reduction="sum").item()
        correct += (out.argmax(1) == y[i:i + batch_size]).sum().item()
    model.train()
    return correct / len(x), loss / len(x)


def default_data_dir():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "data", "mnist")
