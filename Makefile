# The whole vse pipeline, documented as make targets.
#   make demo   — create .venv, install, run extract → relevance → train → evaluate on data/
#   make test   — create .venv, install, run the test suite
# Real data (full Flickr8k, hours on a CPU, minutes on a GPU), FLICKR8K=../shared/data/flickr8k:
#   make f8k-vsepp   — VSE0 (sh) vs VSE++ (mh), the paper's 30-epoch schedule    (issue 3 table)
#   make f8k-losses  — mh, ladder, LSEH, ConVSE, ConVSE++ with CS@K and epochs to best (issue 4)

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

.PHONY: install demo test bench f8k-vsepp f8k-losses clean

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	# torch first, from its pinned build, so sentence-transformers does not pull another one
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[bert,test,onnx]'
	touch $@

install: $(VENV)/.installed

# ---- demo on the bundled 1,000-image Flickr8k subset ------------------------------------
# VSE0 (sum of hinges) against VSE++ (max of hinges), as the VSE++ paper's Fig. 2a, with a
# 512-d joint space so both runs fit in a few minutes on a 2-core CPU.
DEMO_FEATURES = $(CACHE)/demo_effnet_1c.h5
DEMO_RUNS     = $(RUNS)/demo
DEMO_TRAIN    = --features $(DEMO_FEATURES) --epochs 10 --lr-decay-epoch 7 --embed-dim 512 --val-every 0

$(DEMO_FEATURES): $(VENV)/.installed
	$(VSE) extract --dataset flickr8k --root $(DATA) --backbone efficientnet-lite0 --crops 1 --out $@ --quiet

demo: $(DEMO_FEATURES)
	$(VSE) info $(DEMO_FEATURES)
	$(VSE) relevance --features $(DEMO_FEATURES) --method svd --out $(CACHE)/demo_svd.h5
	$(VSE) train $(DEMO_TRAIN) --run-dir $(DEMO_RUNS)/sh --loss sh
	$(VSE) train $(DEMO_TRAIN) --run-dir $(DEMO_RUNS)/mh --loss mh --warmup-epochs 2
	$(VSE) evaluate --checkpoint $(DEMO_RUNS)/mh/best.pt --features $(DEMO_FEATURES) --split test
	$(VSE) evaluate --runs '$(DEMO_RUNS)/*' --split test --out $(DEMO_RUNS)/results.csv
	$(VSE) report $(DEMO_RUNS)/results.csv --format md --columns recall
	$(VSE) plot --runs '$(DEMO_RUNS)/*' --results $(DEMO_RUNS)/results.csv --out $(DEMO_RUNS)/plots
	$(VSE) gallery --checkpoint $(DEMO_RUNS)/mh/best.pt --split test --n 10 --out $(DEMO_RUNS)/gallery.html
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

test: $(VENV)/.installed
	$(PY) -m pytest tests

bench: $(VENV)/.installed
	$(PY) bench/evaluate.py
	$(PY) bench/extract.py
	$(PY) bench/train.py
	$(PY) bench/relevance.py
	$(PY) bench/batch_eval.py
	$(PY) bench/rc.py
	$(PY) bench/scale.py

clean:
	rm -rf $(CACHE)/*.h5 $(CACHE)/*.shards $(RUNS)
