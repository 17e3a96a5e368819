"""fixlab's optional extras (pyproject.toml). `pip install fixlab` runs hosted models, the oracle doubles and the local
sandbox; a feature that needs an extra which is not installed says so in one line (`require`), before anything loads."""
from __future__ import annotations

import importlib.util

# extra -> the modules fixlab imports from it (the first one missing names the problem)
EXTRAS = {
    "local": ("torch", "transformers", "gguf"),  # fixlab's engine and the registry packs (serving/)
    "llamacpp": ("xllamacpp",),  # llama.cpp embedded in the job (serving/llamacpp.py)
    "e2b": ("e2b_code_interpreter",),  # sandbox=e2b
    "dask": ("prefect_dask", "distributed"),  # runner=dask
    "postgres": ("psycopg2",),  # an MLflow store on PostgreSQL (flows/tracking.py)
}


def missing(extra: str) -> str | None:
    """The first module of `extra` that cannot be imported here (found without importing it), None if all can."""
    for module in EXTRAS[extra]:
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):
            return module
    return None


def message(extra: str, who: str, module: str | None = None) -> str:
    module = module or EXTRAS[extra][0]
    return f"{who} needs fixlab's [{extra}] extra ({module} is not installed): pip install 'fixlab[{extra}]'"


def require(extra: str, who: str, error: type[Exception] = ImportError) -> None:
    """Raise `error` with one line naming the extra when one of its modules is missing."""
    module = missing(extra)
    if module is not None:
        raise error(message(extra, who, module))
