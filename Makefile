# The whole vse pipeline, documented as make targets.
#   make demo   — create .venv, install, run extract → relevance → train → evaluate on data/
#   make test   — create .venv, install, run the test suite
# Real data: make f8k FLICKR8K=../shared/data/flickr8k (full Flickr8k, hours on CPU)

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

.PHONY: install demo test bench f8k clean

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	# torch first, from its pinned build, so sentence-transformers does not pull another one
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[bert,test]'
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

test: $(VENV)/.installed
	$(PY) -m pytest tests

bench: $(VENV)/.installed
	$(PY) bench/evaluate.py
	$(PY) bench/extract.py
	$(PY) bench/train.py

clean:
	rm -rf $(CACHE)/*.h5 $(CACHE)/*.shards $(RUNS)
