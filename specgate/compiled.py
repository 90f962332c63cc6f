"""The gateway's request path compiled to C with mypyc, and how `specgate serve` loads it.

The routing decision (gateway/decide: the features, the rules, each candidate's
prediction from the latency model, the draw, the rooms) and the synchronous
parts of the request path around it (`REQUEST_PATH`: the exchange and its
claim, the pools and their leases, the proxy, the relay, the transport and
the answers it reads, the headers forwarded, the usage plan, the prompt key,
the edge's endpoints, middleware, request, body, paths, load view, keys and tracing,
the server's protocol and each request's response cycle,
the wait queue and admission, the flags, the fleet's load, the log line's render and writer, the metrics,
the request's features and priority, what each answer teaches) are
typed Python that runs on every request. mypyc compiles them, unchanged, to
one C extension that runs them in about half the time
(docs/benchmarks/gateway.md). The compiled build is optional and lives
beside the sources, never in place of them:

- `specgate compile` builds every module of `COMPILED` into `build/compiled/`
  with a manifest: the modules, and a fingerprint of the whole gateway's
  sources and the Python and platform that built it.
- `specgate serve` (`--compiled auto`, the default) loads that build when the
  fingerprint still matches and its modules load, through an import finder
  placed before the others, and the pure-Python sources otherwise, saying
  which and why.
  Any edit anywhere in gateway/ makes the build stale: mypyc compiles
  calls between the modules it compiles into direct calls, and may copy
  constants from the modules they import, so a build is whole or not used.
  `--compiled require` refuses to start without a fresh build; `off` never
  loads one.

The tests run the pure-Python sources; tests/integration/test_compiled.py builds the
extension and checks that it decides exactly as the sources do.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PACKAGE = "gateway"
COMPILED = "gateway/decide"  # every module of it but those of `LEFT_OUT`
# the package itself, and the endpoints' table the command line's parser reads (`explain --endpoint`): a module
# imported before `use_compiled` runs cannot be served compiled (tests/unit/ops/test_cli_imports.py)
LEFT_OUT = ("__init__.py", "api_paths.py")
# The request path's modules beside the decision. Not here: pacing.py, whose pacer is an async generator, which
# this mypyc cannot compile; telemetry/spans.py, whose span and tracer the interpreted OTLP ones subclass (a
# compiled class cannot be); the policy's pydantic models.
# The endpoints and middleware took the build from two minutes to six and a half on 2 cores, for 6% fewer
# instructions a request.
REQUEST_PATH = (
    "gateway/edge/auth.py", "gateway/edge/body.py", "gateway/edge/endpoints.py", "gateway/edge/http_protocol.py",
    "gateway/edge/learning.py", "gateway/edge/load_view.py", "gateway/edge/middleware.py", "gateway/edge/paths.py",
    "gateway/edge/preferred.py", "gateway/edge/priority.py", "gateway/edge/request.py",
    "gateway/edge/response_cycle.py", "gateway/edge/tracing.py", "gateway/flags.py",
    "gateway/load.py", "gateway/log_line.py", "gateway/loop_metrics.py", "gateway/metrics.py",
    "gateway/policy/classes.py", "gateway/policy/features.py", "gateway/policy/priority.py",
    "gateway/state/fleet_load.py", "gateway/upstream/admission.py", "gateway/upstream/answer.py",
    "gateway/upstream/balance.py", "gateway/upstream/claim.py", "gateway/upstream/drafting.py",
    "gateway/upstream/events.py", "gateway/upstream/exchange.py", "gateway/upstream/headers.py",
    "gateway/upstream/meter.py",
    "gateway/upstream/pools.py", "gateway/upstream/prefix_map.py", "gateway/upstream/prompt_key.py",
    "gateway/upstream/proxy.py", "gateway/upstream/queue.py", "gateway/upstream/queue_metrics.py",
    "gateway/upstream/read_timer.py", "gateway/upstream/relay.py", "gateway/upstream/retry.py",
    "gateway/upstream/runtime.py", "gateway/upstream/slots.py", "gateway/upstream/target.py",
    "gateway/upstream/transport.py", "gateway/upstream/upstream.py", "gateway/upstream/usage.py",
)
MANIFEST = "manifest.json"
GROUP = "specgate_compiled"  # the shared library's name: `specgate_compiled__mypyc`
MODES = ("auto", "require", "off")


def source_root() -> Path:
    """The folder holding the `gateway` package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the '{PACKAGE}' package cannot be found")
    return Path(next(iter(spec.submodule_search_locations))).parent


def default_build_dir(root: Path | None = None) -> Path:
    return (root or source_root()) / "build" / "compiled"


def compiled_sources(root: Path) -> list[str]:
    """The files mypyc compiles, relative to `root`, in a stable order (those of `REQUEST_PATH` that
    the tree has: a tree from before one of them was written builds without it)."""
    decision = [p for p in (root / COMPILED).glob("*.py") if p.name not in LEFT_OUT]
    path = [root / name for name in REQUEST_PATH if (root / name).is_file()]
    return sorted(str(p.relative_to(root)) for p in (*decision, *path))


def fingerprint(root: Path) -> str:
    """What a build was made from: every gateway source file, and the Python and platform it runs on
    (the C compiler targets the platform's baseline instruction set, never the host's own)."""
    digest = hashlib.sha256(f"{sys.implementation.cache_tag} {sysconfig.get_platform()}\n".encode())
    for path in sorted((root / PACKAGE).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Loaded:
    """What `use_compiled` did: the modules it will serve compiled (none: the sources), and why."""
    modules: tuple[str, ...]
    why: str

    @property
    def compiled(self) -> bool:
        return bool(self.modules)


class CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of one build (its extension files) before any other finder does."""

    def __init__(self, files: Mapping[str, Path]) -> None:
        self.files = dict(files)

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def read_build(build: Path, root: Path) -> tuple[dict[str, Path], str]:
    """The build's modules (name -> extension file) when it is fresh, else none and why not."""
    try:
        manifest = json.loads((build / MANIFEST).read_text())
        files = {name: build / relative for name, relative in manifest["files"].items()}
        made_from, modules = manifest["fingerprint"], manifest["modules"]
    except FileNotFoundError:
        return {}, f"no compiled build in {build} (`specgate compile` makes one)"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return {}, f"the compiled build's manifest in {build} is unreadable ({exc.__class__.__name__}): rebuild it"
    if not isinstance(modules, list) or not all(isinstance(m, str) and m in files for m in modules):
        return {}, f"the compiled build's manifest in {build} is unreadable: rebuild it"
    if made_from != fingerprint(root):
        return {}, "the compiled build is stale: the sources, the Python or the platform changed since " \
                   "(`specgate compile`)"
    outside = [name for name, path in files.items() if not path.resolve().is_relative_to(build.resolve())]
    if outside:
        return {}, f"the compiled build's manifest in {build} names a file outside it ({outside[0]}): rebuild it"
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        return {}, f"the compiled build lacks {missing[0]}: rebuild it"
    return files, ""


def use_compiled(mode: str = "auto", build: Path | None = None, root: Path | None = None) -> Loaded:
    """Place the finder of a fresh build before the others and import its modules (mode `auto` or
    `require`), unless a module it would serve is already imported or one does not load. Raises
    RuntimeError in `require` mode without a build that loads."""
    if mode not in MODES:
        raise ValueError(f"compiled mode must be one of {', '.join(MODES)}, not '{mode}'")
    if mode == "off":
        return Loaded((), "compiled build not used (--compiled off)")
    root = root or source_root()
    files, why = read_build(build or default_build_dir(root), root)
    if files:
        early = sorted(name for name in files if name in sys.modules)
        if early:
            files, why = {}, f"{early[0]} was imported before the compiled build could be used"
    modules = tuple(sorted(name for name in files if name.startswith(PACKAGE + ".")))
    if files:
        why = _load(CompiledFinder(files), modules)
    if why:
        if mode == "require":
            raise RuntimeError(why)
        return Loaded((), why)
    return Loaded(modules, f"{len(modules)} modules compiled with mypyc")


def _load(finder: CompiledFinder, modules: Sequence[str]) -> str:
    """Import `modules` through `finder`, placed first; '' when they loaded, else why not, with the
    finder and whatever it loaded gone again (a truncated or foreign extension fails here, not mid-serve)."""
    sys.meta_path.insert(0, finder)
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception as exc:  # ImportError, or whatever a broken extension's initialisation raises
        sys.meta_path.remove(finder)
        for name in finder.files:
            sys.modules.pop(name, None)
        return f"the compiled build did not load ({exc.__class__.__name__}: {exc}): rebuild it"
    return ""


def build_compiled(build: Path | None = None, root: Path | None = None, verbose: bool = False) -> list[str]:
    """Compile `COMPILED` into `build` (replacing what was there) and write its manifest; the modules."""
    import contextlib
    import os
    import shutil
    import tempfile

    from mypyc.build import mypycify
    from setuptools import Distribution

    root = root or source_root()
    build = build or default_build_dir(root)
    sources = compiled_sources(root)
    made_from = fingerprint(root)  # before: an edit during the build leaves it stale, not wrongly fresh
    with (tempfile.TemporaryDirectory(prefix="specgate-mypyc-") as work, contextlib.chdir(root),
          open(os.devnull, "w") as quiet, contextlib.redirect_stdout(sys.stderr if verbose else quiet)):
        staged = Path(work) / "out"
        extensions = mypycify(sources, opt_level="3", target_dir=str(Path(work) / "c"), group_name=GROUP,
                              verbose=verbose)
        dist = Distribution({"name": "specgate-compiled", "ext_modules": extensions})
        command = dist.get_command_obj("build_ext")
        command.build_lib, command.build_temp, command.verbose = str(staged), str(Path(work) / "temp"), verbose
        dist.run_command("build_ext")
        built = [p for p in staged.rglob("*") if p.name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))]
        files = {".".join((*p.relative_to(staged).parent.parts, p.name.split(".", 1)[0])): str(p.relative_to(staged))
                 for p in built}
        modules = sorted(name for name in files if name.startswith(PACKAGE + "."))
        (staged / MANIFEST).write_text(json.dumps({"fingerprint": made_from, "modules": modules, "files": files},
                                                  indent=1) + "\n")
        if build.exists():
            shutil.rmtree(build)
        build.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), build)
    return modules
