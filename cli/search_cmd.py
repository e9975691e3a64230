"""`vse index`, `vse search`, `vse serve`: a trained model's embeddings, searchable."""

from __future__ import annotations

import dataclasses
import json
import sys

import click

from cli.train_options import parse_key_values
from pipeline.core.registry import RESCORERS
from pipeline.search.faiss_index import GROUPS, KINDS, RECALL_AT, IndexOptions
from pipeline.search.faiss_index import option_default as default
from pipeline.search.searcher import QueryLimits
from pipeline.search.serve import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_THUMB

LIMITS = QueryLimits()


@click.command("index")
@click.argument("embeddings", type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=True),
              help="Index folder to write (index.faiss, items.h5, meta.json).")
@click.option("--of", "of", type=click.Choice(GROUPS), default=default("of"), show_default=True,
              help="Which group of the embeddings file to index.")
@click.option("--kind", type=click.Choice(("auto", *KINDS)), default=default("kind"), show_default=True,
              help="flat: exact; hnsw: graph, approximate, fast; ivfpq: compressed, approximate, small. "
                   "auto: flat below --exact-below items, hnsw from there on.")
@click.option("--exact-below", type=int, default=default("exact_below"), show_default=True,
              help="auto: the item count from which an approximate index is built.")
@click.option("--hnsw-m", type=int, default=default("hnsw_m"), show_default=True,
              help="hnsw: links per node.")
@click.option("--ef-construction", type=int, default=default("ef_construction"), show_default=True,
              help="hnsw: candidate list while building.")
@click.option("--ef-search", type=int, default=None,
              help="hnsw: candidate list while searching [default: the smallest reaching --recall-target].")
@click.option("--nlist", type=int, default=None, help="ivfpq: inverted lists [default: 4·sqrt(N), ≤ N/39].")
@click.option("--pq-m", type=int, default=None,
              help="ivfpq: sub-vectors [default: largest divisor of dim ≤ dim/16].")
@click.option("--nbits", type=int, default=default("nbits"), show_default=True, help="ivfpq: bits per code.")
@click.option("--nprobe", type=int, default=None,
              help="ivfpq: lists searched [default: the smallest reaching --recall-target].")
@click.option("--recall-target", type=float, default=default("recall_target"), show_default=True,
              help=f"recall@{RECALL_AT} the search parameter is tuned to, measured against exact search.")
@click.option("--recall-queries", type=int, default=default("recall_queries"), show_default=True,
              help="Held-out queries of that measurement (the other group's vectors when there are).")
@click.option("--seed", type=int, default=default("seed"), show_default=True,
              help="Seed of the query and training samples.")
@click.option("--image-root", type=click.Path(file_okay=False),
              help="Folder that relative image paths are under (recorded; `vse serve` shows the images).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out file that vse did not write.")
@click.option("--rescore", metavar="NAME", default=None,
              help=f"Store a per-item correction against hubness with the index, applied by `vse search` and "
                   f"`vse serve` (an inductive one of {', '.join(RESCORERS.names)}; docs/PROTOCOL.md, "
                   "'Re-scoring at test time'); flat or hnsw.")
@click.option("--rescore-option", "rescore_option", multiple=True, callback=parse_key_values,
              metavar="KEY=VALUE",
              help="--rescore: an option of the method (JSON value), repeatable.")
@click.option("--rescore-bank", type=click.Path(dir_okay=False), default=None,
              help="--rescore: an embeddings file of the same model whose other group (the queries' "
                   "modality) is the bank [default: the indexed file's].")
def index(embeddings, out, of, kind, exact_below, hnsw_m, ef_construction, ef_search, nlist, pq_m, nbits,
          nprobe, recall_target, recall_queries, seed, image_root, overwrite, rescore, rescore_option,
          rescore_bank):
    """Build a nearest-neighbour index (FAISS, cosine) over an embeddings file of `vse embed`."""
    from pipeline.search.faiss_index import build_index

    options = IndexOptions(kind=kind, of=of, exact_below=exact_below, hnsw_m=hnsw_m,
                           ef_construction=ef_construction, ef_search=ef_search, nlist=nlist, pq_m=pq_m,
                           nbits=nbits, nprobe=nprobe, recall_target=recall_target,
                           recall_queries=recall_queries, seed=seed, rescore=rescore,
                           rescore_options=dict(rescore_option), rescore_bank=rescore_bank)
    result = build_index(embeddings, out, options, image_root=image_root, overwrite=overwrite,
                         log=lambda line: click.echo(line, err=True))
    meta = result.meta
    recall = meta["recall"]
    quality = "exact" if recall["exact"] else f"recall@{recall['at']} {recall['value']:.4f}"
    size = sum(f["bytes"] for f in meta["files"].values())
    corrected = f", + {meta['rescore']['method']}" if meta.get("rescore") else ""
    click.echo(f"wrote {result.out}: {meta['count']} {meta['of']} x {meta['dim']}, {meta['kind']} "
               f"{json.dumps(meta['params'])}{corrected} ({quality}; {size / 2 ** 20:.1f} MB; "
               f"{result.seconds:.1f} s)")
    for note in result.notes:
        click.echo(f"note: {note}")


@click.command("search")
@click.argument("index_path", metavar="INDEX", type=click.Path(file_okay=False))
@click.option("--text", help="A text query.")
@click.option("--image", type=click.Path(dir_okay=False), help="An image file as the query.")
@click.option("-k", "k", type=int, default=10, show_default=True, help="Results.")
@click.option("--checkpoint", type=click.Path(dir_okay=False),
              help="The model's checkpoint, when not where the index's metadata says (same sha256 only).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout.")
def search(index_path, text, image, k, checkpoint, device, as_json):
    """Search an index with a text or an image, embedded by the index's model."""
    from pathlib import Path

    from pipeline.core.errors import VseError
    from pipeline.search.searcher import check_k, check_text, decode_image, open_searcher

    if (text is None) == (image is None):
        raise VseError("give one query: --text TEXT or --image FILE")
    # a local user may ask for any number of results and any file size; the pixel cap stays
    limits = dataclasses.replace(LIMITS, max_k=sys.maxsize, max_upload_bytes=sys.maxsize)
    check_k(k, limits)  # the query is checked before the model is loaded
    if text is not None:
        check_text(text, limits)
    else:
        try:
            data = Path(image).read_bytes()
        except OSError as exc:
            raise VseError(f"cannot read the image ({exc.strerror})", image) from None
        query = decode_image(data, limits, name=str(image))
    searcher = open_searcher(index_path, checkpoint, device, limits)
    answer = searcher.text(text, k) if text is not None else searcher.image(query, k)
    if as_json:
        click.echo(json.dumps({"index": str(index_path), **answer, "of": searcher.index.of}))
        return
    shown = "text" if searcher.index.of == "captions" else "path"
    for hit in answer["results"]:
        extra = f"  {hit[shown]}" if hit[shown] != hit["id"] else ""
        click.echo(f"{hit['rank']:>3}  {hit['score']:.4f}  {hit['id']}{extra}")


@click.command("serve")
@click.argument("index_path", metavar="INDEX", type=click.Path(file_okay=False))
@click.option("--checkpoint", type=click.Path(dir_okay=False),
              help="The model's checkpoint, when not where the index's metadata says (same sha256 only).")
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="Address to listen on (0.0.0.0: every interface; the service has no authentication).")
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--image-root", type=click.Path(file_okay=False),
              help="Folder that relative image paths are under [default: the index's, else the current one].")
@click.option("--max-upload-mb", type=float, default=LIMITS.max_upload_bytes / 2 ** 20, show_default=True,
              help="Largest image upload.")
@click.option("--max-query-chars", type=int, default=LIMITS.max_chars, show_default=True,
              help="Longest text query.")
@click.option("--max-k", type=int, default=LIMITS.max_k, show_default=True, help="Most results per query.")
@click.option("--thumb-size", type=int, default=DEFAULT_THUMB, show_default=True,
              help="Thumbnails' longer side in pixels.")
def serve(index_path, checkpoint, host, port, device, image_root, max_upload_mb, max_query_chars, max_k,
          thumb_size):
    """Serve an index: a JSON API (/api/search, /api/search/image, /api/info) and a search page (/)."""
    from pathlib import Path

    from pipeline.core.errors import VseError
    from pipeline.search.searcher import open_searcher
    from pipeline.search.serve import bind
    from pipeline.search.serve import serve as run

    if max_upload_mb <= 0 or thumb_size < 16:
        raise VseError("--max-upload-mb must be positive and --thumb-size at least 16")
    if image_root is not None and not Path(image_root).is_dir():
        raise VseError("--image-root: no such folder", image_root)
    limits = dataclasses.replace(LIMITS, max_upload_bytes=int(max_upload_mb * 2 ** 20),
                                 max_chars=max_query_chars, max_k=max_k)
    limits.check()
    sock = bind(host, port)  # before the model loads: a taken port is said at once, in one line
    try:
        searcher = open_searcher(index_path, checkpoint, device, limits)
    except BaseException:
        sock.close()
        raise
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"note: listening on {host}, not only this machine: the service has no authentication",
                   err=True)
    info = searcher.index.info()
    click.echo(f"serving {info['count']} {info['of']} ({info['kind']}) of model "
               f"{info['checkpoint_sha256'][:12]} on http://{host}:{port}/", err=True)
    run(searcher, sock=sock, host=host, image_root=image_root, thumb_size=thumb_size)
