"""Every `llmtrain` verb that reads a job file, given a file that is not one LLMTrainingJob mapping
(a list, a plain string, nothing, broken YAML, a second document that is a list): exit non-zero
with ONE line on stderr that names the file and says what was expected, never a traceback
(issue 21: `- a` or `just a string` ended in `AttributeError: 'list' object has no attribute 'get'`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "examples" / "tiny-cpu.yaml").read_text()

# verb -> the arguments after the file (export needs an output directory)
VERBS = {
    "validate": [],
    "render": [],
    "plan": [],
    "local": [],
    "export": ["-o", "{tmp}/out"],
    "scale-test": ["-o", "{tmp}/out"],
}

# name -> (file content, words the one line must contain besides the file name)
FILES = {
    "list": ("- a\n", ["list", "LLMTrainingJob mapping was expected"]),
    "empty-list": ("[]\n", ["list", "LLMTrainingJob mapping was expected"]),
    "string": ("just a string\n", ["string", "LLMTrainingJob mapping was expected"]),
    "number": ("42\n", ["number", "LLMTrainingJob mapping was expected"]),
    "second-document-a-list": (EXAMPLE + "\n---\n- a\n", ["document 2", "list", "LLMTrainingJob mapping"]),
    "empty": ("", ["0 LLMTrainingJobs", "exactly one"]),
    "yaml-syntax-error": ("apiVersion: [\n", ["not valid YAML", "line 2"]),
    "two-jobs": (EXAMPLE + "\n---\n" + EXAMPLE, ["2 LLMTrainingJobs", "exactly one"]),
}


@pytest.mark.parametrize("case", sorted(FILES))
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_file_that_is_not_one_job_mapping_gets_one_line(capsys, tmp_path, verb, case):
    from llmtrain.cli import main

    content, words = FILES[case]
    job = tmp_path / f"{case}.yaml"
    job.write_text(content)
    rc = main([verb, str(job), *(a.format(tmp=tmp_path) for a in VERBS[verb])])
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert rc != 0, out
    assert len(lines) == 1, out.err
    assert str(job) in lines[0], lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
