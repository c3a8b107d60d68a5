#!/usr/bin/env python3
"""Reference for `ddp-bench wine`: the wine baseline in PyTorch's Python.

Same data file, model (13-64-3 ReLU MLP), optimizer (Adam, lr 1e-3), batch 32,
100 epochs and evaluation every 10 as experiments/wine_baseline.json, on one
thread. Prints one JSON record: {impl, seconds, total_seconds,
final_train_loss, test_loss, test_accuracy}.

seconds times what the trainer's epoch loop does (TrainResult::loopSeconds):
per epoch a shuffle, the steps, the train loss, and on evaluation epochs the
test loss and accuracy. total_seconds adds loading and standardizing the
data and building the model and optimizer (runTraining as a whole).
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
    p.add_argument("--eval-every", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    total_start = time.perf_counter()
    xtr, ytr, xte, yte = load(args.data, args.seed, 0.2)
    model = torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    test_loss = acc = None
    for epoch in range(args.epochs):
        model.train()
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
        if epoch + 1 == args.epochs or (args.eval_every > 0 and (epoch + 1) % args.eval_every == 0):
            model.eval()
            with torch.no_grad():
                out = model(xte)
                test_loss = loss_fn(out, yte).item()
                acc = (out.argmax(1) == yte).float().mean().item()
    end = time.perf_counter()
    print(json.dumps({"impl": "torch-python", "seconds": end - start, "total_seconds": end - total_start,
                      "final_train_loss": train_loss, "test_loss": test_loss, "test_accuracy": acc}))


if __name__ == "__main__":
    main()
