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
DEMO_FEATURES = $(CACHE)/demo_effnet_1c.h5
DEMO_RUN      = $(RUNS)/demo_mh

$(DEMO_FEATURES): $(VENV)/.installed
	$(VSE) extract --dataset flickr8k --root $(DATA) --backbone efficientnet-lite0 --crops 1 --out $@

demo: $(DEMO_FEATURES)
	$(VSE) info $(DEMO_FEATURES)
	$(VSE) train --features $(DEMO_FEATURES) --run-dir $(DEMO_RUN) --loss mh --warmup-epochs 1 \
	    --epochs 12 --lr-decay-epoch 8 --batch-size 64 --val-every 0
	$(VSE) evaluate --checkpoint $(DEMO_RUN)/best.pt --features $(DEMO_FEATURES) --split test

test: $(VENV)/.installed
	$(PY) -m pytest tests

bench: $(VENV)/.installed
	$(PY) bench/evaluate.py
	$(PY) bench/extract.py
	$(PY) bench/train.py

clean:
	rm -rf $(CACHE)/*.h5 $(CACHE)/*.shards $(RUNS)
