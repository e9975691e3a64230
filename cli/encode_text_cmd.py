"""`vse encode-text`: one frozen vector per caption of a feature cache (for --text-features),
or with --tokens the set of each caption's token vectors."""

from __future__ import annotations

import click

from pipeline.data.caption_features import DEFAULT_PART_SIZE
from pipeline.text.encoders import ENCODERS


@click.command("encode-text")
@click.option("--features", required=True, type=click.Path(dir_okay=False),
              help="Feature cache (.h5) whose captions get a vector each.")
@click.option("--model", required=True, type=click.Choice(ENCODERS),
              help="minilm (all-MiniLM-L6-v2, 384-d) or cbow (mean GloVe 6B-50d).")
@click.option("--out", required=True, type=click.Path(dir_okay=False),
              help="Caption-feature file to write (.h5), e.g. cache/NAME_text.h5.")
@click.option("--tokens", is_flag=True,
              help="Store every caption's token vectors (float16; minilm: last hidden states, [CLS] and "
                   "[SEP] included; cbow: its words' GloVe vectors) instead of one pooled vector, for "
                   "set-pooling text heads.")
@click.option("--batch-size", default=256, show_default=True, help="Captions per MiniLM batch.")
@click.option("--part-size", default=DEFAULT_PART_SIZE, show_default=True,
              help="Captions per resumable part (a killed run keeps the parts it wrote).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
def encode_text(features, model, out, tokens, batch_size, part_size, device):
    """Encode every caption of a feature cache with a frozen sentence encoder."""
    from pipeline.data.caption_features import describe
    from pipeline.data.caption_features import encode_text as run

    result = run(features, model, out, tokens=tokens, device=device, batch_size=batch_size,
                 part_size=part_size, progress=True)
    if result.up_to_date:
        click.echo(f"{result.out} is up to date: {result.num_captions} captions x {result.dim} ({model})")
    else:
        reused = result.parts - result.parts_computed
        click.echo(f"wrote {result.out}: {result.num_captions} captions x {result.dim} ({model}; "
                   f"{result.parts_computed} of {result.parts} parts computed"
                   + (f", {reused} reused from a killed run)" if reused else ")"))
    for line in describe(result.out):
        click.echo(line)
    for what, count in result.counts.items():
        if count:
            click.echo(f"note: {what.replace('_', ' ')}: {count} (zero vectors)")
