"""What every contract check shares (``vse check-loss``, ``check-pool``, ``check-network``; a plug-in's
own checks may use it too): ``CheckResult``, one check's verdict; ``guarded``, a check run so that
an exception fails it in one line; ``format_results``, the table the commands print."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.plugin_import import user_code_error


@dataclass
class CheckResult:
    check: str
    ok: bool | None          # None: a measurement
    detail: str = ""


def guarded(name: str, check) -> CheckResult:
    """``check()``'s result under ``name``; a check that raises fails, with the error in one line."""
    try:
        result = check()
    except Exception as exc:  # the code under test is any code: where it raised, if it is the user's
        error = user_code_error(exc)
        if error is not None and error is not exc:
            return CheckResult(name, False, str(error))
        text = str(exc).strip().splitlines()
        return CheckResult(name, False, f"{type(exc).__name__}: {text[0] if text else ''}")
    result.check = name
    return result


def format_results(spec: str, results: list[CheckResult], command: str = "check-loss") -> str:
    width = max(len(r.check) for r in results) + 2
    lines = [f"{command} {spec}", f"  {'check':{width}s}{'result':8s}detail"]
    for r in results:
        mark = "-" if r.ok is None else ("ok" if r.ok else "FAIL")
        lines.append(f"  {r.check:{width}s}{mark:8s}{r.detail}")
    return "\n".join(lines)
