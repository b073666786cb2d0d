#!/usr/bin/env python3
"""The series a healthy but noisy run shows Prometheus, for the rule test in
deploy/prometheus/alerts_test.yml ("A healthy but noisy run"): step rewards
uniform in 0.3-0.8, one step a scrape, through the learner's detector
(learner_server/reward_monitor.cc, CollapseDetector, default thresholds) at
the EMA weight ALPHA.

    python3 noisy_reward_series.py ALPHA POINTS SEED
prints four lines: the reward EMA, its peak and the detector (promtool
`values`), then a summary.
"""
import random
import sys


def detector(rewards, alpha, warmup=20, drop=0.3, min_drop=0.05, confirm=5, recover=0.15):
    ema = peak = 0.0
    steps = below = 0
    suspected = False
    for r in rewards:
        ema = r if steps == 0 else (1 - alpha) * ema + alpha * r
        steps += 1
        if steps <= warmup:
            peak, suspected = ema, False
        else:
            peak = max(peak, ema)
            fall = peak - ema
            if suspected:
                suspected = fall > recover * abs(peak)
                below = below if suspected else 0
            else:
                below = below + 1 if fall > drop * abs(peak) and fall >= min_drop else 0
                suspected = below >= confirm
        yield ema, peak, suspected


def main():
    alpha, points, seed = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    rows = list(detector([rng.uniform(0.3, 0.8) for _ in range(points)], alpha))
    print(" ".join("%.3f" % e for e, _, _ in rows))
    print(" ".join("%.3f" % p for _, p, _ in rows))
    print(" ".join("1" if s else "0" for _, _, s in rows))
    print("lowest EMA %.3f, highest peak %.3f, detector on at %d of %d points"
          % (min(e for e, _, _ in rows), max(p for _, p, _ in rows), sum(s for _, _, s in rows), points))


if __name__ == "__main__":
    main()
