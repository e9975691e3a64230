"""Dataset readers: one module per on-disk layout, each named in ``core.registry.READERS``
(whether it has image files, which options it takes). ``load_dataset(kind, root, **options)``
reads any of them into a ``Dataset`` (metadata only: ids, paths, captions, splits; pixels and
features are read lazily by the stages that need them).

    flickr8k        the official Flickr8k layout (token file + three split files)
    karpathy        Karpathy's split JSON (``dataset_{coco,flickr30k,flickr8k}.json``)
    coco            COCO's own ``annotations/captions_{train,val}{2014,2017}.json``
    csv             one (image path, caption) row per line, open_clip's convention (``CsvLayout``)
    vsepp-precomp   VSE++ precomputed features (``{split}_ims.npy`` + ``{split}_caps.txt``)

A new layout is one module here plus one ``READERS`` line. The input policy every reader
follows is in ``base``; the helpers that follow it (``assemble``, split files, UTF-8 lines, safe
paths, file lookups) are in ``toolkit``.

The package hands on its public names (``from pipeline.data.readers import load_csv, CsvLayout``):
``load_dataset``, the input policy's names of ``base``, and every reader function and layout
class that ``READERS`` names, each reader imported when first read.
"""

from __future__ import annotations

from pipeline.core.registry import READERS, Registry
from pipeline.data.readers.base import (
    ConcatenatedRows,
    Dataset,
    LoadReport,
    image_folders,
    image_shape_problem,
    open_image,
)

# name → "module:attribute" of each reader and layout class that READERS names.
PUBLIC = Registry("name", {spec.rpartition(":")[2]: spec for entry in READERS.entries.values()
                           for spec in (entry.reader, entry.layout) if spec})
__all__ = ["ConcatenatedRows", "Dataset", "LoadReport", "image_folders", "image_shape_problem",
           "load_dataset", "open_image", *PUBLIC]

__getattr__, __dir__ = PUBLIC.face(globals())


def load_dataset(kind: str, root, **options) -> Dataset:
    """Read a dataset of layout ``kind`` (a name of ``READERS``) from ``root``; ``options`` are
    the reader's own (``READERS.reader_options`` builds them from flags)."""
    READERS.check_kind(kind)
    return READERS.get_part(kind)(root, **options)
