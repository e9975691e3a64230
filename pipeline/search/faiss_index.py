"""The search index's old single module, kept so its names still import from here: the embeddings
file is ``embeddings_file``, `vse index` (options, tuning, the build) ``index_build``, reading an
index folder back ``index_reader`` (docs/ARCHITECTURE.md, "Search index").
"""

from __future__ import annotations

from pipeline.search.embeddings_file import (  # noqa: F401 (re-exported)
    CHUNK_ROWS,
    GROUP_FIELD,
    GROUPS,
    UNIT_TOLERANCE,
    EmbeddingsFile,
)
from pipeline.search.index_build import (  # noqa: F401 (re-exported)
    EF_SEARCH_STEPS,
    NPROBE_STEPS,
    RECALL_AT,
    TRAIN_SAMPLE_MAX,
    BuildResult,
    ExactTopK,
    IndexOptions,
    build_index,
    choose_kind,
    drop_self,
    new_index,
    option_default,
    recall_at,
    resolved_params,
    tune,
    write_faiss,
    write_items,
)
from pipeline.search.index_reader import (  # noqa: F401 (re-exported)
    FAISS_FILE,
    FORMAT,
    ITEMS_FILE,
    ITEMS_FORMAT,
    KINDS,
    SEARCH_PARAM,
    SearchIndex,
    read_faiss,
    set_search_params,
)

_write_items = write_items  # the old private name, as this module had it
