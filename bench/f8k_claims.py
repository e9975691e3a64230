"""Moved: the papers' claims are data now, tested by `vse claims`.

Each claim set that this script held is a claims file of experiments/claims/ (fast, sets, vse_infty,
saf_short, sgraf_short, sgraf_bf16, precision_sgraf_fp32, precision_sgraf_bf16, vsrn_short, vsrn_last,
noisy with its ranking on SGR, noisy_sgr), and `vse claims experiments/claims/NAME.yaml` (or
`vse claims NAME`) writes its results folder's claims.json; the verdicts are
pipeline/reports/claims.py's (docs/seeds.md). This file holds no claim; run, it says where they went.
"""

import sys

if __name__ == "__main__":
    sys.exit("bench/f8k_claims.py moved: the claims are experiments/claims/NAME.yaml, tested by "
             "`vse claims NAME` (e.g. `vse claims fast`; docs/seeds.md)")
