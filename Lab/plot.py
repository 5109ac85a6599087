#!/usr/bin/env python3
"""Plots for the weak-network lab: python3 Lab/plot.py DIRECTORY (the `tether lab run --output`).

Reads DIRECTORY/results.json and writes:
  latency-cdf.png        end-to-end message latency CDF, one line per scenario
  blackhole-delivery.png messages accepted and delivered over time through the blackhole
  herd-reconnects.png    handshakes per 100 ms after the gateway came back (herd scenario)
Needs matplotlib (pip install matplotlib).
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "lab-results")
    results = [r for r in json.loads((directory / "results.json").read_text()) if not r.get("skipped")]

    figure, axis = plt.subplots(figsize=(9, 5.5))
    for result in results:
        latencies = sorted((d - a) * 1000 for a, d in result["messages"] if d >= 0)
        if not latencies:
            continue
        n = len(latencies)
        axis.plot(latencies, [(i + 1) / n for i in range(n)], label=result["name"])
    axis.set_xscale("log")
    axis.set_xlabel("send() called → Bob's app has it (ms, log scale)")
    axis.set_ylabel("fraction of messages")
    axis.set_title("Reliable message latency per scenario (steady phase and backlog)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(directory / "latency-cdf.png", dpi=120)
    plt.close(figure)

    blackhole = next((r for r in results if r["name"] == "blackhole"), None)
    if blackhole:
        accepted = sorted(a for a, _ in blackhole["messages"])
        delivered = sorted(d for _, d in blackhole["messages"] if d >= 0)
        figure, axis = plt.subplots(figsize=(9, 5))
        axis.step(accepted, range(1, len(accepted) + 1), where="post", label="accepted by send()")
        axis.step(delivered, range(1, len(delivered) + 1), where="post", label="delivered to Bob's app")
        for window in blackhole["windows"]:
            axis.axvspan(window["start"], window["restored"], color="grey", alpha=0.25, label="blackhole")
        axis.set_xlabel("seconds since the start")
        axis.set_ylabel("messages")
        axis.set_title("Delivery through a 30 s blackhole (no signal): nothing lost, backlog drains on recovery")
        axis.grid(True, alpha=0.3)
        axis.legend()
        figure.tight_layout()
        figure.savefig(directory / "blackhole-delivery.png", dpi=120)
        plt.close(figure)

    herd = next((r for r in results if r.get("herd")), None)
    if herd:
        counts = herd["herd"]["connectsPer100ms"]
        figure, axis = plt.subplots(figsize=(9, 4.5))
        axis.bar([i * 0.1 for i in range(len(counts))], counts, width=0.09)
        axis.set_xlabel("seconds after the gateway came back")
        axis.set_ylabel("handshakes per 100 ms")
        axis.set_title(f"Gateway restart with {herd['herd']['clients']} clients: reconnections spread by full jitter")
        axis.grid(True, alpha=0.3)
        figure.tight_layout()
        figure.savefig(directory / "herd-reconnects.png", dpi=120)
        plt.close(figure)
    print(f"plots written to {directory}")


if __name__ == "__main__":
    main()
