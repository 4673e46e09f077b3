"""`python -m harness.evaluation.healthcheck --channel-fd N`: is this GPU still usable?

A tiny kernel on the GPU the child was pinned to, synchronised, its answer checked. Run by the
worker after a child crashed or timed out on that GPU, before the slot takes its next job.
"""

from __future__ import annotations

import argparse

from harness.evaluation.protocol import Channel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--channel-fd", type=int, required=True)
    args = parser.parse_args(argv)
    chan = Channel(args.channel_fd)
    import torch

    n = 1 << 20
    x = torch.arange(n, device="cuda", dtype=torch.float64)
    got = float((x * 2).sum().item())
    torch.cuda.synchronize()
    want = float(n * (n - 1))
    chan.send("health", ok=got == want, detail=f"sum {got:.0f}, expected {want:.0f}",
              device=torch.cuda.get_device_name(0))


if __name__ == "__main__":
    main()
