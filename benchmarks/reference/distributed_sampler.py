"""The sample order of framework/parallel/sampler.cpp (DistributedSampler),
in Python, so a PyTorch reference trains on exactly the batches our ranks
see: std::mt19937_64 seeded with seed + epoch, a Fisher-Yates shuffle with
unbiased bounded draws, and position k of the padded permutation on rank
rank + k * world.

    python3 distributed_sampler.py N SEED EPOCH RANK WORLD [--drop-last]

prints one rank's indices for one epoch, one per line (tests compare them
with the C++ sampler's).
"""
import sys

_MASK = (1 << 64) - 1


class Mt19937_64:
    """std::mt19937_64 (the C++ standard's 64-bit Mersenne Twister)."""

    def __init__(self, seed):
        self.state = [seed & _MASK] + [0] * 311
        for i in range(1, 312):
            prev = self.state[i - 1]
            self.state[i] = (6364136223846793005 * (prev ^ (prev >> 62)) + i) & _MASK
        self.next = 312

    def __call__(self):
        if self.next >= 312:
            s = self.state
            for k in range(312):
                y = (s[k] & 0xFFFFFFFF80000000) | (s[(k + 1) % 312] & 0x7FFFFFFF)
                s[k] = s[(k + 156) % 312] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            self.next = 0
        x = self.state[self.next]
        self.next += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        return (x ^ (x >> 43)) & _MASK


def indices_for_epoch(n, seed, epoch, rank, world, drop_last=False, shuffle=True):
    order = list(range(n))
    if shuffle:
        rng = Mt19937_64(seed + epoch)
        for i in range(n, 1, -1):
            threshold = ((1 << 64) - i) % i  # 2^64 mod i: draws below it would bias the modulo
            r = rng()
            while r < threshold:
                r = rng()
            j = r % i
            order[i - 1], order[j] = order[j], order[i - 1]
    per_rank = n // world if drop_last else -(-n // world)
    return [order[(rank + k * world) % n] for k in range(per_rank)]


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--drop-last"]
    if len(args) != 5:
        raise SystemExit(__doc__)
    n, seed, epoch, rank, world = (int(a) for a in args)
    for i in indices_for_epoch(n, seed, epoch, rank, world, drop_last="--drop-last" in sys.argv):
        print(i)
