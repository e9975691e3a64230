"""`vse claims FILE.yaml`: the claims of a claims file tested over seeds, written as claims.json."""

from __future__ import annotations

import click


@click.command("claims")
@click.argument("claims_file", metavar="FILE.yaml")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="claims.json to write (default: the file's out:, else FILE.json beside FILE.yaml).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out that is not a vse claims file.")
def claims_command(claims_file, out, overwrite):
    """Test each claim of FILE.yaml ("A beats B on M", on the results tables it names) with Welch's
    one-sided t-test over seeds, print the verdicts and write them as claims.json. FILE.yaml may also be
    the name of a claim set of experiments/claims/ (e.g. fast)."""
    from pipeline.reports.claims import claim_set_path, format_verdicts, write_claims

    path, result = write_claims(claim_set_path(claims_file), out, overwrite)
    click.echo(format_verdicts(result))
    click.echo(f"→ {path}")
