# The whole vse pipeline, documented as make targets.
#   make demo   — create .venv, install, run extract → relevance → train → evaluate on data/
#   make test   — create .venv, install, run the test suite
#   make docs   — build the documentation site into site/ (offline; mkdocs.yml, docs/)
# Real data (full Flickr8k, hours on a CPU, minutes on a GPU), FLICKR8K=../shared/data/flickr8k:
#   make f8k-vsepp   — VSE0 (sh) vs VSE++ (mh), the paper's 30-epoch schedule
#                      (a recorded run: bench/results/f8k_sh_vs_mh/)
#   make f8k-losses  — mh, ladder, LSEH, ConVSE, ConVSE++ with CS@K and epochs to best
#                      (a recorded run: bench/results/f8k_losses/)
#   make f8k-fast    — every loss in cached-text mode, 5 seeds, mean ± std, significance, human
#                      judgments (experiments/f8k_fast.yaml; bench/results/f8k_fast/)
#   make f8k-sets    — 1C against the 7 × 7 grid pooled by mean / max / GPO, 3 seeds
#                      (experiments/f8k_sets.yaml; bench/results/f8k_sets/)
#   make f8k-vse-infty — MH vs LSEH (svd, bert) on the VSE∞-style model, 3 seeds, human judgments
#                      (experiments/f8k_vse_infty.yaml; bench/results/f8k_vse_infty/)
#   make f8k-sgraf   — MH vs LSEH (svd) on SGR, SAF and their average, 3 seeds, human judgments
#                      (experiments/f8k_sgraf.yaml; bench/results/f8k_sgraf/; about 10 h on 2 cores)
#   make f8k-saf-short — its one-epoch SAF part (experiments/f8k_saf_short.yaml;
#                      bench/results/f8k_saf_short/, about 1.5 h)
#   make f8k-saf-short-bf16 — its LSEH rows again under CPU bf16 autocast (needs native bf16;
#                      experiments/f8k_saf_short_bf16.yaml; bench/results/f8k_saf_short_bf16/, 25 min)
#   make f8k-sgraf-short — after f8k-saf-short: the same on SGR, then the SGRAF rows (each SGR run's
#                      scores averaged with the SAF run of its loss and seed; f8k_saf_short.yaml with sgr;
#                      bench/results/f8k_sgraf_short/)
#   make f8k-sgraf-bf16 — the SGR/SAF/SGRAF rows, 2 epochs under CPU bf16 (experiments/f8k_sgraf_bf16.yaml;
#                      bench/results/f8k_sgraf_bf16/; about 3 h on 2 cores). The one-epoch bf16 LSEH runs
#                      (f8k-saf-short-bf16 and its SGR twin, `vse sweep experiments/f8k_saf_short_bf16.yaml
#                      --network sgr --name sgr_short_bf16`) are continued where present, else trained from the start
#   make f8k-precision — why bf16 keeps MH alive on SAF: one part's precision changed per arm, 3 seeds,
#                      one epoch at embed 64 (experiments/precision_saf.yaml; bench/results/precision_saf_cpu/;
#                      about 3 h on one core)
#   make f8k-precision-sgraf — the end-of-training table in both precisions: SGR, SAF and SGRAF, MH vs
#                      LSEH (svd), 3 seeds, 3 epochs at embed 64, fp32 then CPU bf16
#                      (experiments/precision_sgraf.yaml; bench/results/precision_sgraf_cpu/)
#   make f8k-precision-fast — the fast loop, MH and LSEH, fp32 against CPU bf16, 3 seeds
#                      (experiments/precision_fast.yaml; bench/results/precision_fast_cpu/)
#   make f8k-vsrn-short — MH vs LSEH (svd) on VSRN (embed 256, no caption branch), 3 seeds: one epoch,
#                      and two with a summed-hinge warm-up (best.pt and last.pt)
#                      (experiments/f8k_vsrn_short.yaml; bench/results/f8k_vsrn_short/)
#   make f8k-noisy   — training on noisy pairs, the fast loop: mh, csn, infonce, siglip, rcl, decl, ncr,
#                      crcl, bicro without noise and at 20/50% caption- and image-level noise, 3 seeds;
#                      the co-trained at equal ensemble size too (bench/results/f8k_noisy/)
#   make f8k-tuned   — the same methods at 0/20/50% caption noise, each tuned on dev with one budget
#                      (TUNE_BUDGET), then 3 seeds on test beside the default-options table
#                      (experiments/f8k_tune.yaml, experiments/tune_table.py; bench/results/f8k_tuned/)
#   make f8k-reality — the reality check: every loss of the fast loop tuned alike (30 trials of the 6-epoch
#                      schedule, TPE, no pruner: the pilot's median pruner failed), its tuned and default options
#                      5 seeds each on test, the papers' claims (experiments/f8k_reality.yaml,
#                      experiments/reality_check.py; bench/results/f8k_reality/; many hours on 2 cores,
#                      resumable: `$(PY) experiments/reality_check.py --dry-run` says what is left and its cost)
#   make f8k-noisy-sgr — SGR at 20% image-level noise: mh, rcl, ncr, 3 seeds, a small size
#                      (experiments/f8k_noisy_sgr.yaml; bench/results/f8k_noisy_sgr/; then the claims)
#   make f8k-text-pool — VSE++'s GRU vs VSE∞'s BiGRU + GPO caption encoder, one seed
#                      (experiments/f8k_text_pool.yaml; bench/results/f8k_text_pool/)
#   make f8k-hubness — every test-time correction against hubness (isf, csls, qbnorm, nnn; dsl,
#                      transductive) on the fast loop's mh and infonce, the noisy table's mh at
#                      caption 50%, VSE∞'s mh and SAF's (precision_saf.yaml, fp32 and bf16), over
#                      their seeds, and the bank's size (experiments/hubness.py; bench/results/f8k_hubness*/)

PYTHON  ?= python3
VENV    ?= .venv
VSE      = $(VENV)/bin/vse
PY       = $(VENV)/bin/python
CACHE   ?= cache
RUNS    ?= runs
DATA    ?= data
FLICKR8K ?= ../shared/data/flickr8k
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1

.PHONY: install demo test docs bench f8k-vsepp f8k-losses f8k-fast f8k-sets f8k-vse-infty f8k-text-pool f8k-sgraf \
	f8k-saf-short f8k-saf-short-bf16 f8k-sgraf-short f8k-sgraf-bf16 f8k-vsrn-short f8k-noisy f8k-tuned f8k-reality f8k-noisy-sgr f8k-hubness \
	f8k-precision f8k-precision-fast f8k-precision-sgraf clean

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	# torch first, from its pinned build, so sentence-transformers does not pull another one
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[bert,test,onnx,serve,docs,cluster]'
	# the browser of the search page's test (playwright drives Debian's chromium; none is downloaded)
	command -v chromium >/dev/null || ! command -v apt-get >/dev/null || apt-get install -y chromium \
	  || echo "note: chromium could not be installed: the search page test will be skipped"
	# the cluster tests' services (tests/cluster_services.py starts them in temp folders): Slurm with munge,
	# PostgreSQL; Debian's packages
	{ command -v slurmctld && command -v munged && ls /usr/lib/postgresql/*/bin/initdb; } >/dev/null 2>&1 \
	  || ! command -v apt-get >/dev/null || apt-get install -y slurm-wlm munge postgresql \
	  || { apt-get update && apt-get install -y slurm-wlm munge postgresql; } \
	  || echo "note: slurm-wlm, munge or postgresql could not be installed: the cluster tests will be skipped"
	touch $@

install: $(VENV)/.installed

# ---- demo on the bundled 1,000-image Flickr8k subset ------------------------------------
# 1. The GRU model: VSE0 (sum of hinges) against VSE++ (max of hinges), as the VSE++ paper's
#    Fig. 2a, with a 512-d joint space so both runs fit in a few minutes on a 2-core CPU.
# 2. The cached-text mode (frozen MiniLM caption vectors): the same two losses, 3 seeds each,
#    one row per loss with mean ± std (n) — a loss experiment in seconds.
DEMO_FEATURES = $(CACHE)/demo_effnet_1c.h5
DEMO_TEXT     = $(CACHE)/demo_minilm_text.h5
DEMO_RUNS     = $(RUNS)/demo
DEMO_TRAIN    = --features $(DEMO_FEATURES) --epochs 10 --lr-decay-epoch 7 --embed-dim 512 --val-every 0

$(DEMO_FEATURES): $(VENV)/.installed
	$(VSE) extract --dataset flickr8k --root $(DATA) --backbone efficientnet-lite0 --crops 1 --out $@ --quiet

$(DEMO_TEXT): $(DEMO_FEATURES)
	$(VSE) encode-text --features $(DEMO_FEATURES) --model minilm --out $@

demo: $(DEMO_FEATURES) $(DEMO_TEXT)
	$(VSE) info $(DEMO_FEATURES)
	$(VSE) relevance --features $(DEMO_FEATURES) --method svd --out $(CACHE)/demo_svd.h5
	$(VSE) train $(DEMO_TRAIN) --run-dir $(DEMO_RUNS)/gru/sh --loss sh
	$(VSE) train $(DEMO_TRAIN) --run-dir $(DEMO_RUNS)/gru/mh --loss mh --warmup-epochs 2
	$(VSE) evaluate --checkpoint $(DEMO_RUNS)/gru/mh/best.pt --features $(DEMO_FEATURES) --split test
	$(VSE) evaluate --runs '$(DEMO_RUNS)/gru/*' --split test --out $(DEMO_RUNS)/gru/results.csv
	$(VSE) report $(DEMO_RUNS)/gru/results.csv --format md --columns recall --bold best
	$(VSE) sweep experiments/demo_fast.yaml --runs-dir $(DEMO_RUNS)
	$(VSE) evaluate --runs '$(DEMO_RUNS)/fast/*' --split test --out $(DEMO_RUNS)/fast/results.csv
	$(VSE) report $(DEMO_RUNS)/fast/results.csv --format md --columns recall
	$(VSE) plot --runs '$(DEMO_RUNS)/gru/*' --results $(DEMO_RUNS)/gru/results.csv --out $(DEMO_RUNS)/plots
	$(VSE) gallery --checkpoint $(DEMO_RUNS)/fast/method=mh,seed=0/best.pt --split test --n 10 \
	  --judgments $(DATA)/CrowdFlowerAnnotations.txt --out $(DEMO_RUNS)/gallery.html
	@cat docs/demo_notes.txt
	@echo "plots:   $(DEMO_RUNS)/plots/"
	@ls $(DEMO_RUNS)/plots
	@echo "gallery: $(DEMO_RUNS)/gallery.html (open it in a browser)"

# ---- the full Flickr8k ----------------------------------------------------------------------
F8K_FEATURES = $(CACHE)/f8k_effnet_1c.h5
F8K_RUNS     = $(RUNS)/f8k
F8K_TRAIN    = --features $(F8K_FEATURES) --val-every 0 --seed 0
# the loss table's reduced model and schedule (fits 2 CPU cores); the papers' is 1024-d, 30 epochs
F8K_SHORT    = $(F8K_TRAIN) --embed-dim 512 --epochs 12 --lr-decay-epoch 8

$(F8K_FEATURES): $(VENV)/.installed
	$(VSE) extract --dataset flickr8k --root $(FLICKR8K) --backbone efficientnet-lite0 --crops 1 --out $@

$(CACHE)/f8k_%.h5: $(F8K_FEATURES)
	$(VSE) relevance --features $(F8K_FEATURES) --method $(subst cbowbert,cbow+bert,$*) --out $@

f8k-vsepp: $(F8K_FEATURES)
	$(VSE) train $(F8K_TRAIN) --run-dir $(F8K_RUNS)/vsepp/sh --loss sh --epochs 30 --lr-decay-epoch 15
	$(VSE) train $(F8K_TRAIN) --run-dir $(F8K_RUNS)/vsepp/mh --loss mh --epochs 30 --lr-decay-epoch 15
	$(VSE) evaluate --runs '$(F8K_RUNS)/vsepp/*' --split test --out $(F8K_RUNS)/vsepp/results.csv
	$(VSE) report $(F8K_RUNS)/vsepp/results.csv --columns recall --epochs-to-best

f8k-losses: $(F8K_FEATURES) $(CACHE)/f8k_svd.h5 $(CACHE)/f8k_bert.h5 $(CACHE)/f8k_cbowbert.h5
	$(VSE) train $(F8K_SHORT) --run-dir $(F8K_RUNS)/losses/mh --loss mh
	$(VSE) train $(F8K_SHORT) --run-dir $(F8K_RUNS)/losses/ladder --loss ladder --relevance $(CACHE)/f8k_cbowbert.h5
	$(VSE) train $(F8K_SHORT) --run-dir $(F8K_RUNS)/losses/lseh --loss lseh --relevance $(CACHE)/f8k_svd.h5
	$(VSE) train $(F8K_SHORT) --run-dir $(F8K_RUNS)/losses/csn --loss csn
	$(VSE) train $(F8K_SHORT) --run-dir $(F8K_RUNS)/losses/cmn --loss cmn
	$(VSE) evaluate --runs '$(F8K_RUNS)/losses/*' --split test --relevance $(CACHE)/f8k_bert.h5 --cs 100,1000 \
	  --out $(F8K_RUNS)/losses/results.csv
	$(VSE) report $(F8K_RUNS)/losses/results.csv --columns recall --epochs-to-best

# ---- the cached-text loss table: both sides cached, 5 seeds per loss ------------------------
F8K_TEXT   = $(CACHE)/f8k_minilm_text.h5
FAST_RUNS  = $(F8K_RUNS)/fast
FAST_OUT   = bench/results/f8k_fast
JUDGMENTS  = $(FLICKR8K)/CrowdFlowerAnnotations.txt

$(F8K_TEXT): $(F8K_FEATURES)
	$(VSE) encode-text --features $(F8K_FEATURES) --model minilm --out $@

f8k-fast: $(F8K_FEATURES) $(F8K_TEXT) $(CACHE)/f8k_svd.h5 $(CACHE)/f8k_bert.h5 $(CACHE)/f8k_cbowbert.h5
	$(VSE) sweep experiments/f8k_fast.yaml --runs-dir $(F8K_RUNS) --jobs 2
	$(VSE) evaluate --runs '$(FAST_RUNS)/*' --split test --relevance $(CACHE)/f8k_bert.h5 --cs 100,1000 \
	  --judgments $(JUDGMENTS) --out $(FAST_OUT)/results.csv
	$(VSE) report $(FAST_OUT)/results.csv --columns recall --epochs-to-best | tee $(FAST_OUT)/table_recall.md
	$(VSE) report $(FAST_OUT)/results.csv --columns human | tee $(FAST_OUT)/table_human.md
	$(VSE) claims experiments/claims/fast.yaml

# ---- sets (VSE∞): the 7 × 7 grid pooled by mean / max / GPO, and LSEH on the VSE∞-style model --
F8K_GRID   = $(CACHE)/f8k_effnet_grid7.h5
F8K_TOKENS = $(CACHE)/f8k_minilm_tokens.h5
SETS_OUT   = bench/results/f8k_sets
INFTY_OUT  = bench/results/f8k_vse_infty
TEXTPOOL_OUT = bench/results/f8k_text_pool

$(F8K_GRID): $(VENV)/.installed
	$(VSE) extract --dataset flickr8k --root $(FLICKR8K) --grid --out $@

$(F8K_TOKENS): $(F8K_FEATURES)
	$(VSE) encode-text --features $(F8K_FEATURES) --model minilm --tokens --out $@

f8k-sets: $(F8K_FEATURES) $(F8K_GRID) $(F8K_TEXT)
	$(VSE) sweep experiments/f8k_sets.yaml --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/sets/*' --split test --judgments $(JUDGMENTS) --out $(SETS_OUT)/results.csv
	$(VSE) report $(SETS_OUT)/results.csv --columns recall --epochs-to-best | tee $(SETS_OUT)/table_recall.md
	$(VSE) claims experiments/claims/sets.yaml
	$(VSE) plot --runs '$(F8K_RUNS)/sets/*' --out $(SETS_OUT)/figures

f8k-vse-infty: $(F8K_GRID) $(F8K_TOKENS) $(CACHE)/f8k_svd.h5 $(CACHE)/f8k_bert.h5
	$(VSE) sweep experiments/f8k_vse_infty.yaml --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/vse_infty/*' --split test --judgments $(JUDGMENTS) \
	  --out $(INFTY_OUT)/results.csv
	$(VSE) report $(INFTY_OUT)/results.csv --columns recall --epochs-to-best | tee $(INFTY_OUT)/table_recall.md
	$(VSE) report $(INFTY_OUT)/results.csv --columns human | tee $(INFTY_OUT)/table_human.md
	$(VSE) claims experiments/claims/vse_infty.yaml
	$(VSE) plot --runs '$(F8K_RUNS)/vse_infty/*' --out $(INFTY_OUT)/figures

SGRAF_OUT = bench/results/f8k_sgraf
SAF_SHORT_OUT = bench/results/f8k_saf_short

# One sweep per network, the same grid in each, so that runs of one folder name pair up for SGRAF
f8k-sgraf: $(F8K_GRID) $(F8K_TOKENS) $(CACHE)/f8k_svd.h5
	$(VSE) sweep experiments/f8k_sgraf.yaml --network sgr --name sgraf_sgr --runs-dir $(F8K_RUNS)
	$(VSE) sweep experiments/f8k_sgraf.yaml --network saf --name sgraf_saf --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/sgraf_sgr/*' --average-with-runs $(F8K_RUNS)/sgraf_saf --split test \
	  --judgments $(JUDGMENTS) --out $(SGRAF_OUT)/results.csv
	$(VSE) report $(SGRAF_OUT)/results.csv --columns recall --epochs-to-best | tee $(SGRAF_OUT)/table_recall.md
	$(VSE) report $(SGRAF_OUT)/results.csv --columns human | tee $(SGRAF_OUT)/table_human.md

f8k-saf-short: $(F8K_GRID) $(F8K_TOKENS) $(CACHE)/f8k_svd.h5
	$(VSE) sweep experiments/f8k_saf_short.yaml --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/saf_short/*' --split test --judgments $(JUDGMENTS) \
	  --out $(SAF_SHORT_OUT)/results.csv
	$(VSE) report $(SAF_SHORT_OUT)/results.csv --columns recall --epochs-to-best | tee $(SAF_SHORT_OUT)/table_recall.md
	$(VSE) report $(SAF_SHORT_OUT)/results.csv --columns human | tee $(SAF_SHORT_OUT)/table_human.md
	$(VSE) claims experiments/claims/saf_short.yaml

f8k-saf-short-bf16: $(F8K_GRID) $(F8K_TOKENS) $(CACHE)/f8k_svd.h5
	$(VSE) sweep experiments/f8k_saf_short_bf16.yaml --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/saf_short_bf16/*' --split test --judgments $(JUDGMENTS) \
	  --out $(SAF_SHORT_OUT)_bf16/results.csv
	$(VSE) report $(SAF_SHORT_OUT)_bf16/results.csv --columns recall --epochs-to-best | tee $(SAF_SHORT_OUT)_bf16/table_recall.md

SGRAF_SHORT_OUT = bench/results/f8k_sgraf_short

# f8k-saf-short's schedule on SGR, then each SGR run with the SAF run of its folder name: the SGR,
# SAF and SGRAF (scores averaged) rows
f8k-sgraf-short: $(F8K_GRID) $(F8K_TOKENS) $(CACHE)/f8k_svd.h5
	$(VSE) sweep experiments/f8k_saf_short.yaml --network sgr --name sgr_short --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/sgr_short/*' --average-with-runs $(F8K_RUNS)/saf_short --split test \
	  --judgments $(JUDGMENTS) --out $(SGRAF_SHORT_OUT)/results.csv
	$(VSE) report $(SGRAF_SHORT_OUT)/results.csv --columns recall --epochs-to-best | tee $(SGRAF_SHORT_OUT)/table_recall.md
	$(VSE) report $(SGRAF_SHORT_OUT)/results.csv --columns human | tee $(SGRAF_SHORT_OUT)/table_human.md
	$(VSE) claims experiments/claims/sgraf_short.yaml

SGRAF_BF16_OUT = bench/results/f8k_sgraf_bf16

# Issue 43's longer-trained rows: f8k_sgraf_bf16.yaml on each network. Its LSEH runs continue the
# one-epoch bf16 runs where they exist (copied into the sweep's folder, never over a run already
# there; the sweep resumes them to its epoch count; without them it trains them from the start),
# the MH runs start; then each SGR run with the SAF run of its
# folder name (the SGRAF rows) and the claims
f8k-sgraf-bf16: $(F8K_GRID) $(F8K_TOKENS) $(CACHE)/f8k_svd.h5
	for net in saf sgr; do for seed in 0 1 2; do \
	  src="$(F8K_RUNS)/$${net}_short_bf16/method=lseh-svd,seed=$$seed"; \
	  dst="$(F8K_RUNS)/sgraf_bf16_$$net/method=lseh-svd,seed=$$seed"; \
	  if [ -d "$$src" ] && [ ! -e "$$dst" ]; then mkdir -p "$$(dirname "$$dst")" && cp -r "$$src" "$$dst"; fi; \
	done; done
	$(VSE) sweep experiments/f8k_sgraf_bf16.yaml --network saf --name sgraf_bf16_saf --runs-dir $(F8K_RUNS) --resume
	$(VSE) sweep experiments/f8k_sgraf_bf16.yaml --network sgr --name sgraf_bf16_sgr --runs-dir $(F8K_RUNS) --resume
	$(VSE) evaluate --runs '$(F8K_RUNS)/sgraf_bf16_sgr/*' --average-with-runs $(F8K_RUNS)/sgraf_bf16_saf --split test \
	  --judgments $(JUDGMENTS) --out $(SGRAF_BF16_OUT)/results.csv
	$(VSE) report $(SGRAF_BF16_OUT)/results.csv --columns recall --epochs-to-best | tee $(SGRAF_BF16_OUT)/table_recall.md
	$(VSE) report $(SGRAF_BF16_OUT)/results.csv --columns human | tee $(SGRAF_BF16_OUT)/table_human.md
	$(VSE) claims experiments/claims/sgraf_bf16.yaml

# ---- precision (issue 53): why bf16 keeps MH alive on SAF, one part at a time; does the fast loop care?
PRECISION_OUT      = bench/results/precision_saf_cpu
PRECISION_ARMS     = fp32 bf16 fp32-scores-bf16 bf16-scores-fp32 fp32-scores-noise fp32-gemm-tf32 bf16-max1
PRECISION_FAST_OUT = bench/results/precision_fast_cpu

f8k-precision: $(F8K_GRID) $(F8K_TOKENS)
	for arm in $(PRECISION_ARMS); do for seed in 0 1 2; do test -f $(PRECISION_OUT)/runs/$$arm-s$$seed.json || \
	  PYTHONPATH=. $(PY) experiments/precision_arms.py --arm $$arm --seed $$seed --out $(PRECISION_OUT)/runs \
	    --runs-dir $(RUNS)/precision || exit 1; done; done
	PYTHONPATH=. $(PY) experiments/precision_table.py $(PRECISION_OUT)

f8k-precision-fast: $(F8K_FEATURES) $(F8K_TEXT) $(CACHE)/f8k_svd.h5
	$(VSE) sweep experiments/precision_fast.yaml --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/precision_fast/*' --split test --judgments $(JUDGMENTS) \
	  --out $(PRECISION_FAST_OUT)/results.csv
	$(VSE) report $(PRECISION_FAST_OUT)/results.csv --columns recall | tee $(PRECISION_FAST_OUT)/table_recall.md
	PYTHONPATH=. $(PY) experiments/precision_table.py --fast $(PRECISION_FAST_OUT)

PRECISION_SGRAF_OUT  = bench/results/precision_sgraf_cpu
PRECISION_SGRAF_RUNS = $(RUNS)/precision

# Issue 53, item 2: SGR and SAF, MH against LSEH (SVD), 3 seeds, 3 epochs, in fp32 and then under CPU
# bf16 (experiments/precision_sgraf.yaml); the two networks train side by side, a thread each (two
# single-thread processes on 2 cores do not slow each other; two 2-thread ones do). Resumable: a
# sweep skips its finished runs and continues an unfinished one from its last.pt. Then each
# precision's SGR runs with the SAF run of their folder name (the SGRAF rows), tables and claims,
# and each epoch's dev rsum over the seeds (did a method recover or collapse after epoch 1?)
f8k-precision-sgraf: $(F8K_GRID) $(F8K_TOKENS) $(CACHE)/f8k_svd.h5
	for prec in fp32 bf16; do amp=$$(test $$prec = bf16 && echo --cpu-amp || echo --no-cpu-amp); \
	  OMP_NUM_THREADS=1 $(VSE) sweep experiments/precision_sgraf.yaml --network saf --name saf_$$prec $$amp \
	    --runs-dir $(PRECISION_SGRAF_RUNS) --resume & saf=$$!; \
	  OMP_NUM_THREADS=1 $(VSE) sweep experiments/precision_sgraf.yaml --network sgr --name sgr_$$prec $$amp \
	    --runs-dir $(PRECISION_SGRAF_RUNS) --resume & sgr=$$!; \
	  wait $$saf; saf=$$?; wait $$sgr && test $$saf = 0 || exit 1; done
	for prec in fp32 bf16; do \
	  $(VSE) evaluate --runs "$(PRECISION_SGRAF_RUNS)/sgr_$$prec/*" --average-with-runs $(PRECISION_SGRAF_RUNS)/saf_$$prec \
	    --split test --judgments $(JUDGMENTS) --out $(PRECISION_SGRAF_OUT)/results_$$prec.csv && \
	  $(VSE) report $(PRECISION_SGRAF_OUT)/results_$$prec.csv --columns recall --epochs-to-best \
	    | tee $(PRECISION_SGRAF_OUT)/table_recall_$$prec.md && \
	  $(VSE) claims experiments/claims/precision_sgraf_$$prec.yaml || exit 1; done
	PYTHONPATH=. $(PY) experiments/precision_table.py --fast $(PRECISION_SGRAF_OUT)
	$(PY) experiments/dev_curves.py '$(PRECISION_SGRAF_RUNS)/s*_fp32/*' '$(PRECISION_SGRAF_RUNS)/s*_bf16/*' \
	  | tee $(PRECISION_SGRAF_OUT)/dev_rsum.md

VSRN_SHORT_OUT = bench/results/f8k_vsrn_short

f8k-vsrn-short: $(F8K_GRID) $(CACHE)/f8k_svd.h5
	$(VSE) sweep experiments/f8k_vsrn_short.yaml --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/vsrn_short/*' --split test --judgments $(JUDGMENTS) \
	  --out $(VSRN_SHORT_OUT)/results.csv
	$(VSE) report $(VSRN_SHORT_OUT)/results.csv --columns recall --epochs-to-best | tee $(VSRN_SHORT_OUT)/table_recall.md
	$(VSE) report $(VSRN_SHORT_OUT)/results.csv --columns human | tee $(VSRN_SHORT_OUT)/table_human.md
	$(VSE) claims experiments/claims/vsrn_short.yaml
	$(VSE) evaluate --runs '$(F8K_RUNS)/vsrn_short/*-warm,seed=*' --checkpoint-name last.pt --split test \
	  --judgments $(JUDGMENTS) --out $(VSRN_SHORT_OUT)/results_last.csv
	$(VSE) claims experiments/claims/vsrn_last.yaml

NOISY_OUT     = bench/results/f8k_noisy
NOISY_SGR_OUT = bench/results/f8k_noisy_sgr

# At equal ensemble size (docs/PROTOCOL.md, "Ensemble size"; experiments/claims/noisy_equal_size.yaml):
# each co-trained run's network 0 gets a row of its own (--member 0), and mh's seeds 3-5 pair with its
# seeds 0-2 (seed s with s+3: no seed in two pairs) into 2-seed ensembles, set beside ncr's and bicro's
# two networks.
NOISY_PAIRS = $(F8K_RUNS)/noisy_mh_pairs

f8k-noisy: $(F8K_FEATURES) $(F8K_TEXT)
	$(VSE) sweep experiments/f8k_noisy.yaml --runs-dir $(F8K_RUNS) --jobs 2
	$(VSE) sweep experiments/f8k_noisy.yaml --only method=mh --seeds 3-5 --runs-dir $(F8K_RUNS) --jobs 2
	$(VSE) evaluate --runs '$(F8K_RUNS)/noisy/*seed=[012]' --member 0 --split test --judgments $(JUDGMENTS) \
	  --out $(NOISY_OUT)/results.csv --keep-evaluated
	mkdir -p $(NOISY_PAIRS) && for run in $(F8K_RUNS)/noisy/*method=mh,seed=[345]; do \
	  name=$$(basename "$$run"); seed=$${name##*seed=}; \
	  ln -sfn "$$(cd "$$run" && pwd)" "$(NOISY_PAIRS)/$${name%seed=*}seed=$$((seed - 3))"; done
	$(VSE) evaluate --runs '$(F8K_RUNS)/noisy/*method=mh,seed=[012]' --average-with-runs $(NOISY_PAIRS) \
	  --split test --judgments $(JUDGMENTS) --out $(NOISY_OUT)/results_pairs.csv
	$(VSE) report $(NOISY_OUT)/results.csv --columns noisy | tee $(NOISY_OUT)/table_noisy.md
	$(VSE) report $(NOISY_OUT)/results.csv --columns human | tee $(NOISY_OUT)/table_human.md
	$(VSE) claims experiments/claims/noisy.yaml
	$(VSE) claims experiments/claims/noisy_equal_size.yaml

# Equal tuning (experiments/f8k_tune.yaml says what a budget can and cannot settle on 2 cores): one
# `vse tune` study per method × noise with the same budget, two at a time; resumable step by step.
TUNE_BUDGET ?= 6x2

f8k-tuned: $(F8K_FEATURES) $(F8K_TEXT)
	$(PY) experiments/tune_table.py experiments/f8k_tune.yaml --budget $(TUNE_BUDGET) --jobs 2 \
	  --runs-dir $(F8K_RUNS) --judgments $(JUDGMENTS)

# The reality check (issue 60): each loss's search and the budget stated once in its YAML; two studies
# at a time; every step resumable and skipped when its files exist.
f8k-reality: $(F8K_FEATURES) $(F8K_TEXT) $(CACHE)/f8k_svd.h5 $(CACHE)/f8k_bert.h5 $(CACHE)/f8k_cbowbert.h5
	$(PY) experiments/reality_check.py experiments/f8k_reality.yaml --jobs 2 --runs-dir $(F8K_RUNS) \
	  --judgments $(JUDGMENTS)

f8k-noisy-sgr: $(F8K_GRID) $(F8K_TOKENS)
	$(VSE) sweep experiments/f8k_noisy_sgr.yaml --runs-dir $(F8K_RUNS) --jobs 2
	$(VSE) evaluate --runs '$(F8K_RUNS)/noisy_sgr/*' --split test --judgments $(JUDGMENTS) \
	  --out $(NOISY_SGR_OUT)/results.csv
	$(VSE) report $(NOISY_SGR_OUT)/results.csv --columns noisy | tee $(NOISY_SGR_OUT)/table_noisy.md
	$(VSE) claims experiments/claims/noisy.yaml
	$(VSE) claims experiments/claims/noisy_sgr.yaml

# Its dual runs are those of f8k-fast (mh, infonce) and f8k-noisy (mh at caption 50%), trained there;
# VSE∞'s mh and SAF's two precision arms it trains itself (about 40 and 2 × 20 minutes here).
HUBNESS_OUT = bench/results/f8k_hubness
HUBNESS = PYTHONPATH=. $(PY) experiments/hubness.py --judgments $(JUDGMENTS)
f8k-hubness: $(F8K_FEATURES) $(F8K_TEXT) $(F8K_GRID) $(F8K_TOKENS)
	$(HUBNESS) --runs-dir $(F8K_RUNS)
	$(VSE) sweep experiments/f8k_vse_infty.yaml --runs-dir $(F8K_RUNS) --only method=mh
	$(HUBNESS) --sweep experiments/f8k_vse_infty.yaml:method=mh --runs-dir $(F8K_RUNS) \
	  --out $(HUBNESS_OUT)_vse_infty --claims experiments/claims/hubness_vse_infty.yaml
	$(VSE) sweep experiments/precision_saf.yaml --runs-dir $(RUNS)/precision
	$(HUBNESS) --sweep experiments/precision_saf.yaml:method=mh --runs-dir $(RUNS)/precision \
	  --rescore-bank-size 1000 --out $(HUBNESS_OUT)_saf --claims experiments/claims/hubness_saf.yaml
	$(VSE) sweep experiments/precision_saf.yaml --runs-dir $(RUNS)/precision --cpu-amp --name precision_saf_bf16
	$(HUBNESS) --runs '$(RUNS)/precision/precision_saf_bf16/*' --rescore-bank-size 1000 \
	  --out $(HUBNESS_OUT)_saf_bf16 --claims experiments/claims/hubness_saf_bf16.yaml
	for n in 1000 500; do $(HUBNESS) --runs-dir $(F8K_RUNS) --rescore-bank-size $$n --out $(HUBNESS_OUT)_bank$$n \
	  || exit 1; done
	for n in 5000 1000; do $(PY) bench/rescore.py --bank-images $$n --threads 1 --repeats 3 --indexes \
	  --out bench/results/rescore_cost_bank$$n.json || exit 1; done
	$(HUBNESS) --bank-table --out $(HUBNESS_OUT)

f8k-text-pool: $(F8K_FEATURES)
	$(VSE) sweep experiments/f8k_text_pool.yaml --runs-dir $(F8K_RUNS)
	$(VSE) evaluate --runs '$(F8K_RUNS)/text_pool/*' --split test --judgments $(JUDGMENTS) \
	  --out $(TEXTPOOL_OUT)/results.csv
	$(VSE) report $(TEXTPOOL_OUT)/results.csv --columns recall --epochs-to-best | tee $(TEXTPOOL_OUT)/table_recall.md

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(PY) -m pytest tests

# The documentation site (mkdocs.yml): docs/*.md, the command pages from the click commands and the
# results tables from bench/results/, filled in by docs/hooks/vse_docs.py; --strict stops at a broken
# link or anchor, a page outside the nav or a missing results file (tests/test_docs.py runs it too)
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: $(VENV)/.installed
	$(PY) bench/evaluate.py
	$(PY) bench/extract.py
	$(PY) bench/train.py
	$(PY) bench/relevance.py
	$(PY) bench/batch_eval.py
	$(PY) bench/rc.py
	$(PY) bench/scale.py
	$(PY) bench/search.py

clean:
	rm -rf $(CACHE)/*.h5 $(CACHE)/*.shards $(RUNS)
