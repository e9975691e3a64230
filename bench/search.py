"""Search bench: `vse index` and `SearchIndex` on synthetic unit vectors, and `vse serve` under load.

Per dimension (``--dims``, default 1024 and 256), ``--n`` items (default 1,000,000):

1. an embeddings file as `vse embed` writes it (docs/ARCHITECTURE.md): the ``images`` group
   holds the ``n`` vectors, the ``captions`` group ``--tune-queries`` (1,000) more from the same
   generator: the held-out queries that `vse index` measures (and tunes) recall@10 on;
2. per kind (``--kinds``, default flat and auto, which is hnsw from 100,000 items on), one
   child process runs ``build_index`` on it (the code of `vse index`): build time, index size
   on disk, peak RSS;
3. one child per kind opens the index (``SearchIndex``: digests checked, FAISS file read) and
   searches ``--eval-queries`` (1,000) other held-out vectors, none seen while tuning: batched
   (one call), then one query at a time (``--single`` of them; flat: ``--single-flat``):
   queries/s, p50/p99 latency of single queries, recall@10 against the flat index's results
   (exact), peak RSS (the serving process's memory).

Then the service (``--service-seconds``, default 30): `vse serve`'s app on uvicorn in a child
process on 127.0.0.1 over the last dimension's approximate index, ``--clients`` (8) concurrent
httpx clients sending GET /api/search with demo captions, one request at a time each:
requests/s, p50/p99 latency, errors (anything but a 200). The query embedder is a parameter:
the tests' stand-in (random unit vectors keyed by the text, no model: the service and
search cost alone) unless ``--checkpoint CKPT --service-index INDEX`` name a real model and
an index of its embeddings.

Corrected indexes (issue 61; ``--rescore-methods``, default nnn and qbnorm, each with its defaults):
per dimension and kind, over ``--rescore-n`` items (default 100,000), `vse index --rescore METHOD`
is built in a child with a fixed bank (the file's ``captions`` group: the ``--tune-queries`` vectors),
and a child searches the ``--eval-queries`` held-out vectors with it (``SearchIndex``: the stored
correction applied) and compares them with the corrected exhaustive ranking: the method's own code
(``pipeline.evaluation.rescore``) fitted on the same bank and applied to the exact float32 scores of
every item. Recorded: recall@10 against it (1.0 expected of flat: the index is exact), how much the
correction changes the exact top 10 (``changed_at_10``: 1 − recall of the raw exhaustive top 10
against the corrected one; 0 would make the recall say nothing), qbnorm's share of corrected queries
(their raw top-1 in its activation set), batched queries/s. It goes to the ``rescore`` key of
``--out``; ``--rescore-only`` runs this part alone and replaces only that key (the rest of the file
kept), e.g. ``--rescore-only --rescore-n 20000 --dims 256 --kinds flat,hnsw``.

Generator (``generate``): a mixture of ``CLUSTERS`` = 1,000 Gaussian clusters in a
``LATENT`` = 64-d space (centres N(0, I), spread ``SPREAD`` = 1.0 around them, so clusters
overlap), mapped by a fixed random orthonormal 64 × D basis into D dimensions, plus isotropic
noise of ``NOISE`` = 0.7 of the signal's norm, normalised to unit length. Uniform random
vectors in 1024-d have no near neighbours (every cosine ≈ 0): the worst case, no model's
embeddings look like that; here the nearest cosines are ≈ 0.45 against ≈ 0 for a random pair.

Prints one JSON object and writes it to ``--out`` (bench/results/search.json). Needs about
3 × n × D × 4 bytes of free disk (embeddings file, flat and hnsw index; 12 GB at 1M × 1024)
and n × D × 4 × 1.3 bytes of memory per child. Run it on a quiet machine (``machine.loadavg``).

    python bench/search.py [--n 1000000] [--dims 1024,256] [--kinds flat,auto]
    python bench/search.py --rescore-only [--rescore-n 100000] [--rescore-methods nnn,qbnorm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchkit import write_report  # noqa: E402

CLUSTERS, LATENT, SPREAD, NOISE, BASIS_SEED = 1000, 64, 1.0, 0.7, 1234
GEN_CHUNK = 65536
RECALL_K = 10  # the corrected indexes' recall@K (the raw part's is the index's own, recall_at's k)
ITEMS_SEED, TUNE_SEED, EVAL_SEED = 0, 1, 2


def generate(n: int, dim: int, seed: int, start: int = 0) -> np.ndarray:
    """Rows [start, start + n) of the synthetic set ``seed`` (the same rows whatever the chunking)."""
    latent = min(LATENT, dim)
    basis_rng = np.random.default_rng(BASIS_SEED)
    centres = basis_rng.standard_normal((CLUSTERS, latent)).astype(np.float32)
    basis = np.linalg.qr(basis_rng.standard_normal((dim, latent)))[0].T.astype(np.float32)
    sigma = NOISE * np.sqrt(latent * (1 + SPREAD ** 2)) / np.sqrt(dim)
    out = np.empty((n, dim), dtype=np.float32)
    for at in range(start - start % GEN_CHUNK, start + n, GEN_CHUNK):
        rng = np.random.default_rng([seed, at // GEN_CHUNK])
        z = centres[rng.integers(CLUSTERS, size=GEN_CHUNK)]
        z = z + SPREAD * rng.standard_normal((GEN_CHUNK, latent), dtype=np.float32)
        x = z @ basis + sigma * rng.standard_normal((GEN_CHUNK, dim), dtype=np.float32)
        lo, hi = max(at, start), min(at + GEN_CHUNK, start + n)
        out[lo - start:hi - start] = x[lo - at:hi - at]
    out /= np.linalg.norm(out, axis=1, keepdims=True)
    return out


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def write_embeddings_file(path: Path, n: int, dim: int, tune_queries: int, checkpoint: Path) -> None:
    """The embeddings file of EMBEDDINGS.md, written chunk by chunk (never n × D in memory)."""
    import h5py

    from pipeline.core.fsutil import file_sha256

    text = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        images = f.create_group("images")
        vectors = images.create_dataset("vectors", (n, dim), dtype=np.float32, chunks=(1024, dim))
        for start in range(0, n, GEN_CHUNK):
            vectors[start:start + GEN_CHUNK] = generate(min(GEN_CHUNK, n - start), dim, ITEMS_SEED, start)
        ids = [f"synthetic/{i:07d}.jpg" for i in range(n)]
        images.create_dataset("ids", data=ids, dtype=text)
        images.create_dataset("paths", data=ids, dtype=text)
        images.create_dataset("failed", data=[], dtype=text)
        captions = f.create_group("captions")
        captions.create_dataset("vectors", data=generate(tune_queries, dim, TUNE_SEED))
        captions.create_dataset("ids", data=[f"q{i}" for i in range(tune_queries)], dtype=text)
        captions.create_dataset("texts", data=[f"query {i}" for i in range(tune_queries)], dtype=text)
        f.attrs.update({"format": "vse-embeddings", "format_version": 1,
                        "checkpoint_sha256": file_sha256(checkpoint), "checkpoint": str(checkpoint),
                        "similarity": "cosine", "dim": dim, "image_pipeline": json.dumps({"synthetic": True}),
                        "caption_encoder": json.dumps({"synthetic": True}), "created": "bench",
                        "vse_version": "bench"})
        f.attrs["complete"] = True


# ---------------------------------------------------------------------------- children


def child_build(args) -> dict:
    from pipeline.search.faiss_index import IndexOptions, build_index

    options = IndexOptions(kind=args.kind, rescore=args.rescore or None)
    result = build_index(args.embeddings, args.index, options, overwrite=True)
    meta = result.meta
    return {"kind": meta["kind"], "kind_requested": args.kind, "params": meta["params"],
            "seconds": round(result.seconds, 2), "add_seconds": meta["build"]["seconds"],
            "tuning_seconds": meta["build"]["tuning_seconds"],
            "index_bytes": meta["files"]["index.faiss"]["bytes"],
            "items_bytes": meta["files"]["items.h5"]["bytes"],
            "recall_at_build": meta["recall"], "peak_rss_mb": peak_rss_mb()}


def child_query(args) -> dict:
    from pipeline.search.faiss_index import SearchIndex, recall_at

    queries = generate(args.eval_queries, args.dim, EVAL_SEED)
    started = time.perf_counter()
    index = SearchIndex(args.index)
    load = time.perf_counter() - started
    index.search(queries[:8], 10)  # warm-up
    started = time.perf_counter()
    _, rows = index.search(queries, 10)
    batched = time.perf_counter() - started
    latencies = []
    for q in queries[:args.single]:
        started = time.perf_counter()
        index.search(q[None], 10)
        latencies.append(time.perf_counter() - started)
    out = {"load_seconds": round(load, 2), "batched_queries": len(queries),
           "batched_qps": round(len(queries) / batched, 1), "single_queries": len(latencies),
           "single_qps": round(len(latencies) / sum(latencies), 1),
           "single_p50_ms": round(1000 * float(np.percentile(latencies, 50)), 3),
           "single_p99_ms": round(1000 * float(np.percentile(latencies, 99)), 3)}
    if args.truth:
        truth = np.load(args.truth)
        out["recall_at_10"] = round(recall_at(rows, truth), 4)
    else:  # the exact index: its results are the truth of the others
        np.save(args.save_truth, rows)
        out["recall_at_10"] = 1.0
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def child_rescore_query(args) -> dict:
    """A corrected index (``--rescore``) searching the held-out queries, against the corrected
    exhaustive ranking: the method fitted on the file's bank by its own code, applied to exact scores."""
    import torch

    from pipeline.evaluation.rescore import build_rescorer
    from pipeline.search.faiss_index import SearchIndex, recall_at

    queries = generate(args.eval_queries, args.dim, EVAL_SEED)
    items = torch.from_numpy(generate(args.n, args.dim, ITEMS_SEED)).T  # as write_embeddings_file wrote them
    method = build_rescorer(args.rescore)
    bank = torch.from_numpy(generate(args.tune_queries, args.dim, TUNE_SEED))  # the file's captions
    correction = method.fit(bank @ items, items.shape[1])
    raw = torch.from_numpy(queries) @ items
    truth = method.apply(raw, correction).topk(RECALL_K, dim=1).indices.numpy()
    index = SearchIndex(args.index)
    index.search(queries[:8], RECALL_K)  # warm-up
    started = time.perf_counter()
    _, rows = index.search(queries, RECALL_K)
    batched = time.perf_counter() - started
    out = {"recall_at_10": round(recall_at(rows, truth), 4),
           "changed_at_10": round(1 - recall_at(raw.topk(RECALL_K, dim=1).indices.numpy(), truth), 4),
           "batched_queries": len(queries), "batched_qps": round(len(queries) / batched, 1),
           "bank": int(correction.bank_size), "index_recall_at_build": index.meta["recall"]}
    if correction.active is not None:  # qbnorm: the queries whose raw top-1 is in the activation set
        out["corrected_queries"] = round(float(correction.active[raw.argmax(dim=1)].float().mean()), 4)
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def bench_rescore(args, dims: list[int], kinds: list[str], workdir: Path, checkpoint: Path) -> dict:
    """The corrected indexes' recall (``child_rescore_query``) per dimension, method and kind."""
    import faiss

    methods = [m for m in args.rescore_methods.split(",") if m]
    load_start, rows = os.getloadavg(), []
    for dim in dims:
        embeddings = workdir / f"rescore_{dim}.h5"
        write_embeddings_file(embeddings, args.rescore_n, dim, args.tune_queries, checkpoint)
        for method in methods:
            for kind in kinds:
                index = workdir / f"rescore_{dim}_{method}_{kind}"
                build = run_child("build", embeddings=embeddings, index=index, kind=kind, rescore=method)
                query = run_child("rescore_query", index=index, dim=dim, n=args.rescore_n, rescore=method,
                                  tune_queries=args.tune_queries, eval_queries=args.eval_queries)
                print(f"{dim}-d {method} {build['kind']}: {query}", file=sys.stderr)
                rows.append({"n": args.rescore_n, "dim": dim, "method": method, "kind": build["kind"],
                             "params": build["params"], "build_seconds": build["seconds"], **query})
                shutil.rmtree(index)
        embeddings.unlink()
    return {"methods": methods, "options": "each method's defaults (pipeline/evaluation/rescore.py)",
            "bank": f"fixed: the file's captions group ({args.tune_queries} vectors)", "recall_at": RECALL_K,
            "truth": "the corrected exhaustive ranking (bench/search.py, 'Corrected indexes')",
            "eval_queries": args.eval_queries, "results": rows,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "machine": {"cpu": _cpu_name(), "faiss_threads": faiss.omp_get_max_threads(),
                        "loadavg_start": [round(x, 2) for x in load_start],
                        "loadavg_end": [round(x, 2) for x in os.getloadavg()]}}


def child_serve(args) -> None:
    from pipeline.search.faiss_index import SearchIndex
    from pipeline.search.searcher import QueryLimits, Searcher, open_searcher
    from pipeline.search.serve import serve

    if args.checkpoint:
        searcher = open_searcher(args.index, args.checkpoint)
    else:
        from search_fakes import StandInEmbedder

        index = SearchIndex(args.index)
        searcher = Searcher(index, StandInEmbedder(index.checkpoint_sha256, index.dim), QueryLimits())
    if args.http == "httptools":  # uvicorn's default before vse capped the request head (for comparison)
        import uvicorn

        from pipeline.search.serve import bind, create_app

        config = uvicorn.Config(create_app(searcher), http="httptools", log_level="warning",
                                server_header=False)
        uvicorn.Server(config).run(sockets=[bind("127.0.0.1", args.port)])
        return
    serve(searcher, host="127.0.0.1", port=args.port, log_level="warning")


def run_child(mode: str, **options) -> dict:
    command = [sys.executable, __file__, "--child", mode]
    for key, value in options.items():
        command += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"child {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- the service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def load_test(url: str, clients: int, seconds: float, queries: list[str]) -> dict:
    import httpx

    latencies, errors, statuses = [], 0, {}
    deadline = time.perf_counter() + seconds

    async def client(worker: int):
        nonlocal errors
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            i = worker
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    response = await http.get("/api/search", params={"q": queries[i % len(queries)], "k": 10})
                    ok = response.status_code == 200 and len(response.json()["results"]) == 10
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                except httpx.HTTPError:
                    ok = False
                latencies.append(time.perf_counter() - started)
                errors += not ok
                i += clients

    started = time.perf_counter()
    await asyncio.gather(*(client(w) for w in range(clients)))
    elapsed = time.perf_counter() - started
    return {"clients": clients, "seconds": round(elapsed, 1), "requests": len(latencies),
            "requests_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(1000 * float(np.percentile(latencies, 50)), 2),
            "p99_ms": round(1000 * float(np.percentile(latencies, 99)), 2),
            "errors": errors, "statuses": {str(k): v for k, v in sorted(statuses.items())}}


def bench_service(index: Path, checkpoint, clients: int, seconds: float, http: str = "vse") -> dict:
    import httpx
    from search_fakes import demo_items

    port = free_port()
    command = [sys.executable, __file__, "--child", "serve", "--index", str(index), "--port", str(port),
               "--http", http]
    if checkpoint:
        command += ["--checkpoint", str(checkpoint)]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        started = time.perf_counter()
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the server stopped:\n{server.stderr.read()[-3000:]}")
            try:
                info = httpx.get(url + "/api/info", timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        ready = time.perf_counter() - started
        _, captions = demo_items(1000)
        queries = [c for cs in captions for c in cs]
        result = asyncio.run(load_test(url, clients, seconds, queries))
        rss = _rss_mb(server.pid)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"index": {k: info[k] for k in ("kind", "count", "dim", "recall")},
            "embedder": "checkpoint" if checkpoint else "stand-in (tests/search_fakes.py: no model)",
            "endpoint": "GET /api/search?q=<a demo caption>&k=10", "startup_seconds": round(ready, 1),
            "server_rss_mb": rss, "http": http, **result}


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--dims", default="1024,256")
    parser.add_argument("--kinds", default="flat,auto", help="flat first: its results are the truth")
    parser.add_argument("--tune-queries", type=int, default=1000)
    parser.add_argument("--eval-queries", type=int, default=1000)
    parser.add_argument("--single", type=int, default=1000)
    parser.add_argument("--single-flat", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--service-seconds", type=float, default=30.0)
    parser.add_argument("--service-index", type=Path, help="an index of a real model's embeddings")
    parser.add_argument("--checkpoint", type=Path, help="its model (else the stand-in embedder)")
    parser.add_argument("--workdir", type=Path, help="[default: a temporary folder, removed]")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "search.json")
    parser.add_argument("--rescore-methods", default="nnn,qbnorm", help="corrected indexes ('': none)")
    parser.add_argument("--rescore-n", type=int, default=100_000, help="items of the corrected indexes")
    parser.add_argument("--rescore-only", action="store_true",
                        help="only the corrected indexes, into --out's rescore key (the rest kept)")
    # children
    parser.add_argument("--child", choices=("build", "query", "rescore_query", "serve"))
    parser.add_argument("--rescore", default="", help="child: the index's correction")
    parser.add_argument("--embeddings", type=Path)
    parser.add_argument("--index", type=Path)
    parser.add_argument("--kind")
    parser.add_argument("--dim", type=int)
    parser.add_argument("--truth", default="")
    parser.add_argument("--save-truth", type=Path)
    parser.add_argument("--port", type=int)
    parser.add_argument("--http", choices=("vse", "httptools"), default="vse")
    parser.add_argument("--compare-http", action="store_true",
                        help="also serve with uvicorn's httptools (no head cap), interleaved with vse's h11")
    args = parser.parse_args()

    if args.child == "build":
        print(json.dumps(child_build(args)))
        return
    if args.child == "query":
        print(json.dumps(child_query(args)))
        return
    if args.child == "rescore_query":
        print(json.dumps(child_rescore_query(args)))
        return
    if args.child == "serve":
        child_serve(args)
        return

    import faiss

    load_start = os.getloadavg()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vse_search_bench_"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkpoint = workdir / "synthetic-model.pt"
    checkpoint.write_bytes(b"synthetic model: its sha256 is the identity the index records")
    kinds = args.kinds.split(",")
    dims = [int(d) for d in args.dims.split(",") if d]
    if args.rescore_only:
        try:
            part = bench_rescore(args, dims, kinds, workdir, checkpoint)
        finally:
            if args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        report = json.loads(args.out.read_text()) if args.out.is_file() else {"bench": "search"}
        report["rescore"] = part
        print(json.dumps(part, indent=1))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        return
    results, targets, service_index, corrected = [], {}, None, None
    try:
        for dim in dims:  # --dims '': the service alone
            embeddings = workdir / f"embeddings_{dim}.h5"
            started = time.perf_counter()
            write_embeddings_file(embeddings, args.n, dim, args.tune_queries, checkpoint)
            print(f"{dim}-d: embeddings written in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            truth = workdir / f"truth_{dim}.npy"
            by_kind = {}
            for kind in kinds:
                index = workdir / f"index_{dim}_{kind}"
                build = run_child("build", embeddings=embeddings, index=index, kind=kind)
                print(f"{dim}-d {kind}: built {build}", file=sys.stderr)
                exact = build["kind"] == "flat"
                query = run_child("query", index=index, dim=dim, eval_queries=args.eval_queries,
                                  single=args.single_flat if exact else args.single,
                                  **({"save_truth": truth} if exact else {"truth": truth}))
                print(f"{dim}-d {kind}: {query}", file=sys.stderr)
                row = {"n": args.n, "dim": dim, "kind": build["kind"], "build": build, "query": query}
                results.append(row)
                by_kind[build["kind"]] = row
                if exact:
                    shutil.rmtree(index)  # disk: the exact results are kept, the index is not needed
                else:
                    if service_index is not None:
                        shutil.rmtree(service_index)
                    service_index = index  # the last approximate index serves the load test
            flat = by_kind.get("flat")
            for kind, row in by_kind.items():
                if kind == "flat" or flat is None:
                    continue
                q, fq = row["query"], flat["query"]
                single_x = q["single_qps"] / fq["single_qps"]
                batched_x = q["batched_qps"] / fq["batched_qps"]
                targets[f"{dim}-d {kind}"] = {
                    "recall_at_10": q["recall_at_10"], "single_qps_vs_flat": round(single_x, 1),
                    "batched_qps_vs_flat": round(batched_x, 1),
                    "met": q["recall_at_10"] >= 0.95 and single_x >= 10 and batched_x >= 10}
            embeddings.unlink()
        service = None
        if args.service_seconds > 0:
            chosen = args.service_index or service_index
            if chosen is not None:
                service = bench_service(chosen, args.checkpoint if args.service_index else None,
                                        args.clients, args.service_seconds)
                print(f"service: {service}", file=sys.stderr)
                if args.compare_http:  # vse's h11 (head cap + deadline) against httptools, interleaved
                    rounds = []
                    for _ in range(2):
                        for http in ("httptools", "vse"):
                            rounds.append(bench_service(chosen,
                                                        args.checkpoint if args.service_index else None,
                                                        args.clients, args.service_seconds, http))
                    service = {"vse": service, "rounds": rounds}
        if args.rescore_methods:
            corrected = bench_rescore(args, dims, kinds, workdir, checkpoint)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)

    report = {
        "bench": "search", "n": args.n, "eval_queries": args.eval_queries, "tune_queries": args.tune_queries,
        "generator": {"clusters": CLUSTERS, "latent_dim": LATENT, "spread": SPREAD, "noise": NOISE,
                      "description": __doc__.split("Generator (``generate``): ")[1].split("\n\n")[0]
                      .replace("\n", " ")},
        "results": results, "target": "recall@10 >= 0.95 at >= 10x flat's queries/s (single and batched)",
        "targets": targets, "service": service, "rescore": corrected,
        "machine": {"cpu": _cpu_name(), "cpus": os.cpu_count(),
                    "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1),
                    "faiss": faiss.__version__, "faiss_threads": faiss.omp_get_max_threads(),
                    "loadavg_start": [round(x, 2) for x in load_start],
                    "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
    }
    write_report(report, args.out, indent=1)


if __name__ == "__main__":
    main()
