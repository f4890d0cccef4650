"""One writer of the job's lifecycle: act.write_status is the only code that writes status.phase,
attempt, restarts or reason, and it writes decide's plan (controller/policy/decide.py sets them).

Read from the operator package's source (ast), every path to the status subresource:
  * the raw request on `.../{name}/status` is made in kube.patch_job_status, or in
    kube.patch_running_progress (the monitor's) with a literal JSON patch whose writing operations
    touch /status/progress alone; no generated client method writes a status (`patch_*_status`,
    `replace_*_status`, `create_*_status`);
  * kube.patch_job_status is used in act.write_status, or with a literal update whose keys are
    none of those four (the monitor's `{"progress": ...}`);
  * act.write_status is given `plan.status`, decide's plan;
  * no kopf handler patches status (`patch.status`, `patch["status"]`).
"""

from __future__ import annotations

import ast
import textwrap

from .test_import_graph import PACKAGES, _module

PKG = PACKAGES["llmtrain"]

OWNED = {"phase", "attempt", "restarts", "reason"}
STATUS_WRITER = ("llmtrain.controller.adapters.kube", "patch_job_status")
PROGRESS_WRITER = ("llmtrain.controller.adapters.kube", "patch_running_progress")
PROGRESS_PATH = "/status/progress"
THE_WRITER = ("llmtrain.controller.adapters.act", "write_status")


def _functions(tree: ast.AST) -> dict[int, str]:
    """id(node) → the name of the outermost function it is in."""
    where: dict[int, str] = {}
    for top in ast.walk(tree):
        if isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(top):
                where.setdefault(id(node), top.name)
    return where


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _literal_keys(call: ast.Call) -> set[str] | None:
    """The constant keys of the first dict literal among the call's arguments; None without one."""
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        if isinstance(arg, ast.Dict) and all(isinstance(k, ast.Constant) for k in arg.keys):
            return {k.value for k in arg.keys if isinstance(k, ast.Constant)}
    return None


def _path_text(node: ast.AST) -> str:
    """The string constants of a path expression (`_OBJECTS + "/{name}/status"`), joined."""
    return "".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def _json_patch_paths(body: ast.AST) -> set[str] | None:
    """The paths a literal JSON patch (a list of dict literals) writes (every op but `test`); None
    when the body is not such a literal."""
    if not isinstance(body, ast.List):
        return None
    paths = set()
    for op in body.elts:
        if not isinstance(op, ast.Dict) or not all(isinstance(k, ast.Constant) for k in op.keys):
            return None
        fields = {k.value: v for k, v in zip(op.keys, op.values, strict=True) if isinstance(k, ast.Constant)}
        kind, path = fields.get("op"), fields.get("path")
        if not isinstance(kind, ast.Constant) or not isinstance(path, ast.Constant):
            return None
        if kind.value != "test":
            paths.add(path.value)
    return paths


def writers(sources: dict[str, str]) -> list[str]:
    """Every place in `sources` ({module: source}) that could write the owned fields other than
    the one writer, as 'module:line: why'."""
    found = []
    for mod, source in sources.items():
        tree = ast.parse(source)
        fn, parent = _functions(tree), _parents(tree)

        def bad(node: ast.AST, why: str, mod: str = mod) -> None:
            found.append(f"{mod}:{node.lineno}: {why}")

        for node in ast.walk(tree):
            in_fn = fn.get(id(node))
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name == "_request" and len(node.args) >= 2 and _path_text(node.args[1]).endswith("/status"):
                    if (mod, in_fn) == PROGRESS_WRITER:
                        paths = _json_patch_paths(node.args[3]) if len(node.args) >= 4 else None
                        if paths is None or paths - {PROGRESS_PATH}:
                            bad(node, f"{PROGRESS_WRITER[1]} writes {sorted(paths) if paths else 'unknown paths'}")
                    elif (mod, in_fn) != STATUS_WRITER:
                        bad(node, f"a status subresource request outside {'.'.join(STATUS_WRITER)}")
                elif (
                    name != STATUS_WRITER[1]
                    and name.endswith("_status")
                    and name.startswith(("patch_", "replace_", "create_"))
                ):
                    bad(node, f"{name}: a status write through the generated client")
                if name == THE_WRITER[1] and len(node.args) >= 3 and ast.unparse(node.args[2]) != "plan.status":
                    bad(node, f"write_status is given {ast.unparse(node.args[2])}, not decide's plan.status")
            ref = (isinstance(node, ast.Attribute) and node.attr == STATUS_WRITER[1]) or (
                isinstance(node, ast.Name) and node.id == STATUS_WRITER[1]
            )
            if ref and (mod, in_fn) not in (STATUS_WRITER, THE_WRITER):
                call = parent.get(id(node))
                while call is not None and not isinstance(call, ast.Call):
                    call = parent.get(id(call))
                keys = _literal_keys(call) if call is not None else None
                if keys is None or keys & OWNED:
                    bad(node, f"patch_job_status with {sorted(keys & OWNED) if keys else 'an update of unknown keys'}")
            if isinstance(node, ast.Attribute) and node.attr == "status" and ast.unparse(node.value) == "patch":
                bad(node, "a kopf handler patches status")
            if isinstance(node, ast.Subscript) and ast.unparse(node) == "patch['status']":
                bad(node, "a kopf handler patches status")
    return found


def _package() -> dict[str, str]:
    return {_module(p, PKG): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def test_only_act_write_status_writes_phase_attempt_restarts_reason():
    sources = _package()
    uses = [m for m, src in sources.items() if STATUS_WRITER[1] in src]
    assert set(uses) >= {STATUS_WRITER[0], THE_WRITER[0]}, uses  # what is scanned
    assert "llmtrain.controller.adapters.monitor" in [m for m, src in sources.items() if PROGRESS_WRITER[1] in src]
    assert writers(sources) == []


def test_the_scan_finds_another_writer():
    """Each way around the one writer, planted in a module of its own, is found."""
    planted = textwrap.dedent(
        """
        from . import kube

        def fail_fast(op, o):
            op.kube.patch_job_status(o.namespace, o.name, {"phase": "Failed", "reason": "Mine"})

        def write_any(op, o, update):
            kube.patch_job_status(o.namespace, o.name, update)

        def raw(ns, name):
            kube._request("PATCH", _OBJECTS + "/{name}/status", {"name": name}, {"status": {"attempt": 9}})

        def generated(api, ns, name):
            api.patch_namespaced_custom_object_status("llmtrain.dev", "v1alpha1", ns, "llmtrainingjobs", name, {})

        def around_decide(op, o):
            act.write_status(op, o, {"restarts": 0})

        def handler(patch, **_):
            patch.status["phase"] = "Running"
        """
    )
    found = writers({"llmtrain.controller.planted": planted})
    assert sorted(int(f.split(":")[1]) for f in found) == [5, 8, 11, 14, 17, 20], found
    # the monitor's progress write may write /status/progress only
    progress = textwrap.dedent(
        """
        def patch_running_progress(namespace, name, progress):
            return _request("PATCH", _OBJECTS + "/{name}/status", {}, [
                {"op": "test", "path": "/status/phase", "value": "Running"},
                {"op": "add", "path": "/status/phase", "value": "Failed"},
            ])
        """
    )
    assert [f.split(":")[1] for f in writers({PROGRESS_WRITER[0]: progress})] == ["3"]
    only_progress = progress.replace('"/status/phase", "value": "Failed"', '"/status/progress"')
    assert writers({PROGRESS_WRITER[0]: only_progress}) == []
    # the monitor's own write, as it is written, is not one
    monitor = 'async def check(self):\n    await self._in_pool(self.op.kube.patch_job_status, ns, n, {"progress": p})\n'
    assert writers({"llmtrain.controller.adapters.monitor": monitor}) == []
