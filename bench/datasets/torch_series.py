#!/usr/bin/env python3
"""PyTorch (CPU) training-checkpoint series: fine-tuning a small text classifier.

The model, in the order of its state_dict:
  embed   nn.Embedding(VOCAB, 128, sparse=True), trained with SparseAdam: a step changes only
          the rows (and their Adam moments) of the tokens in its batch, so rows of tokens the
          fine-tuning set never uses stay bit-identical between checkpoints.
  frozen  nn.Linear(16 * 128, HIDDEN), requires_grad False and not given to any optimizer (a
          pretrained first layer over the concatenated 16-token window): never changes.
  fc1/fc2/head  trainable nn.Linear layers, trained with Adam: every value changes every step.

The fine-tuning set is fixed: SAMPLES windows of 16 token ids drawn once from a Zipf law
(exponent 1.2) by id, as in a BPE vocabulary whose ids are ordered roughly by frequency; each
epoch goes over all of it in a new order. Labels come from a fixed random teacher, so the
loss falls. After each epoch it writes SERIES_DIR/snap-NN/model.pt with
  torch.save({'model': model.state_dict(),
              'optim': {'dense': adam.state_dict(), 'sparse': sparse_adam.state_dict()},
              'epoch': e}, path)
Everything is seeded and single-threaded, so a rerun writes the same bytes.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

WINDOW = 16  # tokens per sample
DIM = 128  # embedding width (a row is 512 bytes)
CLASSES = 100
ZIPF = 1.2

CONFIGS = {
    # vocab, frozen output width, fc1/fc2 width, fine-tuning windows, batch, epochs
    "full": dict(vocab=32_000, hidden=4096, width=256, samples=4000, batch=32, epochs=8),
    "quick": dict(vocab=8_000, hidden=512, width=256, samples=960, batch=32, epochs=3),
}


class Classifier(nn.Module):
    def __init__(self, vocab, hidden, width):
        super().__init__()
        self.embed = nn.Embedding(vocab, DIM, sparse=True)
        self.frozen = nn.Linear(WINDOW * DIM, hidden)
        self.frozen.requires_grad_(False)
        self.fc1 = nn.Linear(hidden, width)
        self.fc2 = nn.Linear(width, width)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens):
        x = self.embed(tokens).flatten(1)
        x = torch.relu(self.frozen(x))
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.head(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("series_dir")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--epochs", type=int)
    args = ap.parse_args()
    cfg = dict(CONFIGS["quick" if args.quick else "full"])
    if args.epochs:
        cfg["epochs"] = args.epochs

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(1234)
    rng = np.random.default_rng(1234)

    vocab = cfg["vocab"]
    model = Classifier(vocab, cfg["hidden"], cfg["width"])
    dense = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("embed")]
    adam = torch.optim.Adam(dense, lr=1e-3)
    sparse_adam = torch.optim.SparseAdam(list(model.embed.parameters()), lr=1e-2)

    # Fixed random teacher: a sample's label is argmax of a projection of the mean of fixed
    # random vectors of its tokens.
    teacher_vec = torch.from_numpy(rng.standard_normal((vocab, 16)).astype(np.float32))
    teacher_proj = torch.from_numpy(rng.standard_normal((16, CLASSES)).astype(np.float32))
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    probs = ranks**-ZIPF
    probs /= probs.sum()
    loss_fn = nn.CrossEntropyLoss()

    dataset = rng.choice(vocab, size=(cfg["samples"], WINDOW), p=probs)
    steps = cfg["samples"] // cfg["batch"]
    for epoch in range(cfg["epochs"]):
        t0 = time.monotonic()
        total = 0.0
        seen = np.zeros(vocab, dtype=bool)
        order = rng.permutation(cfg["samples"])
        for step in range(steps):
            ids = dataset[order[step * cfg["batch"] : (step + 1) * cfg["batch"]]]
            seen[ids] = True
            tokens = torch.from_numpy(ids)
            labels = (teacher_vec[tokens].mean(1) @ teacher_proj).argmax(1)
            adam.zero_grad(set_to_none=True)
            sparse_adam.zero_grad(set_to_none=True)
            loss = loss_fn(model(tokens), labels)
            loss.backward()
            adam.step()
            sparse_adam.step()
            total += loss.item()
        snap = os.path.join(args.series_dir, f"snap-{epoch:02d}")
        os.makedirs(snap, exist_ok=True)
        torch.save(
            {
                "model": model.state_dict(),
                "optim": {"dense": adam.state_dict(), "sparse": sparse_adam.state_dict()},
                "epoch": epoch,
            },
            os.path.join(snap, "model.pt"),
        )
        print(
            f"torch: epoch {epoch} loss {total / steps:.4f} "
            f"embedding rows touched {seen.mean() * 100:.1f}% "
            f"{os.path.getsize(os.path.join(snap, 'model.pt'))} bytes "
            f"{time.monotonic() - t0:.1f} s",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
