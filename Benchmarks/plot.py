#!/usr/bin/env python3
"""Chart of a side-by-side run: python3 plot.py DIRECTORY (the `tether-bench run --output`).

Writes DIRECTORY/side-by-side.png: per body size, sequential latency (p50 and p99) and
throughput with 1, 16 and 256 requests in flight on one connection, for every peer.
Needs matplotlib (pip install matplotlib).
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "bench-results")
    results = json.loads((directory / "results.json").read_text())
    bodies = sorted({r["bodyBytes"] for r in results})
    peers = list(dict.fromkeys(r["peer"] for r in results))
    in_flights = sorted({r["inFlight"] for r in results if not r["sequential"]})

    figure, axes = plt.subplots(len(bodies), 2, figsize=(13, 4.5 * len(bodies)), squeeze=False)
    for row, body in enumerate(bodies):
        rows = [r for r in results if r["bodyBytes"] == body]
        sequential = {r["peer"]: r for r in rows if r["sequential"]}
        latency = axes[row][0]
        x = range(len(peers))
        latency.bar([i - 0.2 for i in x], [sequential.get(p, {}).get("p50") or 0 for p in peers], 0.4, label="p50")
        latency.bar([i + 0.2 for i in x], [sequential.get(p, {}).get("p99") or 0 for p in peers], 0.4, label="p99")
        latency.set_xticks(list(x), peers, rotation=30, ha="right")
        latency.set_yscale("log")
        latency.set_ylabel("µs (log scale)")
        latency.set_title(f"Sequential round trip, {body}-byte body (lower is better)")
        latency.legend()
        latency.grid(True, axis="y", which="both", alpha=0.3)

        throughput = axes[row][1]
        width = 0.8 / max(1, len(in_flights))
        for index, in_flight in enumerate(in_flights):
            rates = {r["peer"]: r["completed"] / r["seconds"] for r in rows if not r["sequential"] and r["inFlight"] == in_flight}
            throughput.bar(
                [i - 0.4 + width * (index + 0.5) for i in x],
                [rates.get(p, 0) for p in peers],
                width,
                label=f"{in_flight} in flight",
            )
        throughput.set_xticks(list(x), peers, rotation=30, ha="right")
        throughput.set_yscale("log")
        throughput.set_ylabel("requests/s, one connection (log scale)")
        throughput.set_title(f"Throughput, {body}-byte body (higher is better)")
        throughput.legend()
        throughput.grid(True, axis="y", which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(directory / "side-by-side.png", dpi=110)
    print(f"chart written to {directory / 'side-by-side.png'}")


if __name__ == "__main__":
    main()
