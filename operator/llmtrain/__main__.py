"""The `llmtrain` command's entry point (the console script, and `python -m llmtrain`).

It imports the CLI only when it runs. Each process that multiprocessing's spawn starts re-runs the
imports of the script its parent was started from, so when the console script imported the CLI,
every tokenizer worker of `llmtrain prepare` loaded the spec, pydantic and jinja2 for nothing: a
prepare of one document on two workers took 0.78 s, and 0.59 s once the script imported only this.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
