#!/usr/bin/env python3
"""Reference for `ddp-bench wine`: the wine baseline in PyTorch's Python.

Same data file, model (13-64-3 ReLU MLP), optimizer (Adam, lr 1e-3), batch 32
and 100 epochs as experiments/wine_baseline.json, on one thread. Prints one
JSON record: {impl, seconds, final_train_loss, test_accuracy}.
"""
import argparse
import json
import time

import numpy as np
import torch


def load(path, seed, test_fraction):
    raw = np.loadtxt(path, delimiter=",", skiprows=1)
    x, y = raw[:, :-1].astype(np.float32), raw[:, -1].astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    mean, std = x[train].mean(0), x[train].std(0)
    std[std == 0] = 1
    x = (x - mean) / std
    return (torch.from_numpy(x[train]), torch.from_numpy(y[train]),
            torch.from_numpy(x[test]), torch.from_numpy(y[test]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = load(args.data, args.seed, 0.2)
    model = torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    for _ in range(args.epochs):
        perm = torch.randperm(len(xtr), generator=gen)
        total = 0.0
        for i in range(0, len(xtr), args.batch_size):
            idx = perm[i:i + args.batch_size]
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        train_loss = total / len(xtr)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    print(json.dumps({"impl": "torch-python", "seconds": seconds, "final_train_loss": train_loss,
                      "test_accuracy": acc}))


if __name__ == "__main__":
    main()
