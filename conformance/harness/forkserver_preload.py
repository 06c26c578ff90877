"""Imported by the forkserver alone (isolation.PRELOAD): load the adapters the harness names,
and import their `preload` modules, so that every worker forked afterwards starts with
them imported. The harness's own process never imports this module, nor any adapter.

Loading an adapter runs its code, and nothing that code does may take the harness with it:

* an exception, `sys.exit` or a KeyboardInterrupt it raises is kept in FAILURES (spec ->
  what happened), which a worker reads before it loads the adapter itself (an AdapterError:
  exit status 2);
* a hang is ended after the harness's allowance (`--load-timeout`) by faulthandler, which
  writes every thread's stack to the log and ends this process;
* a crash ends this process too.

In both last cases the harness's next start of a worker fails, and it reads in the log what
was being imported (isolation.forkserver_failure).
"""

import faulthandler
import importlib
import os

from .isolation import ADAPTERS_VARIABLE, LOAD_SECONDS_VARIABLE, LOG_VARIABLE
from .protocol import AdapterError, ended, load_adapter

FAILURES: dict[str, str] = {}
"""What loading each adapter spec, or importing a module of its preload, ended in."""


def load(specs: list[str], log) -> None:
    for spec in specs:
        log.write(f"loading adapter {spec}\n")
        try:
            adapter = load_adapter(spec)
        except AdapterError as error:
            FAILURES[spec] = str(error)
            continue
        except BaseException as error:  # noqa: BLE001 - the adapter's code, whatever it raised
            FAILURES[spec] = f"adapter {spec!r}: loading it {ended(error)}"
            continue
        for module in adapter.preload:
            log.write(f"importing {module} (the preload of adapter {spec})\n")
            try:
                importlib.import_module(module)
            except BaseException as error:  # noqa: BLE001 - a module the adapter names: its code
                FAILURES[spec] = (f"adapter {spec!r}: its preload module {module!r} cannot be imported: importing it "
                                  f"{ended(error)}; fix the module or the adapter's `preload`")
                break
    log.write("loaded\n")


specs = [spec for spec in os.environ.get(ADAPTERS_VARIABLE, "").split("\n") if spec]
if specs:
    with open(os.environ[LOG_VARIABLE], "a", buffering=1) as log:
        faulthandler.dump_traceback_later(float(os.environ[LOAD_SECONDS_VARIABLE]), exit=True, file=log)
        try:
            load(specs, log)
        finally:
            faulthandler.cancel_dump_traceback_later()
