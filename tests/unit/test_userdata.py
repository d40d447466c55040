"""kiln's settings inside cloud-init user-data: every form cloud-init accepts, and bad input."""

from __future__ import annotations

import base64
import gzip
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.choice.resolve import layers_from_inputs, merge
from kiln.choice.schema import validate_fields
from kiln.choice.sources import RawInputs
from kiln.choice.userdata import MAX_USER_DATA_BYTES, extract_settings

WRITE_FILES = b"""#cloud-config
write_files:
  - path: /etc/kiln/kiln.yaml
    permissions: "0600"
    content: |
      profile: llama-3.3-70b-instruct
      objective: latency
      price_per_hour: 6.74
"""


def test_write_files_entry_is_read() -> None:
    got = extract_settings(WRITE_FILES)
    assert got.settings == {"profile": "llama-3.3-70b-instruct", "objective": "latency", "price_per_hour": 6.74}
    assert got.file_content is not None and got.file_content.startswith("profile:")
    assert not got.problems


def test_top_level_kiln_key_is_read() -> None:
    got = extract_settings(b"#cloud-config\nkiln:\n  profile: qwen3-8b\n")
    assert got.settings == {"profile": "qwen3-8b"}


def test_gzip_and_base64_content() -> None:
    inner = base64.b64encode(gzip.compress(b"profile: qwen3-8b\n")).decode()
    doc = f"#cloud-config\nwrite_files:\n  - path: /etc/kiln/kiln.yaml\n    encoding: gz+b64\n    content: {inner}\n"
    assert extract_settings(gzip.compress(doc.encode())).settings == {"profile": "qwen3-8b"}


def test_mime_multipart() -> None:
    message = MIMEMultipart()
    message.attach(MIMEText("#!/bin/sh\necho hi\n", "x-shellscript"))
    message.attach(MIMEText("#cloud-config\nkiln:\n  objective: latency\n", "cloud-config"))
    assert extract_settings(message.as_bytes()).settings == {"objective": "latency"}


def test_shell_script_user_data_has_no_settings_and_no_problem() -> None:
    got = extract_settings(b"#!/bin/bash\napt-get update\n")
    assert got.settings is None and not got.problems


def test_broken_yaml_names_the_line() -> None:
    got = extract_settings(b"#cloud-config\nwrite_files:\n  - path: /etc/kiln/kiln.yaml\n   content: [\n")
    assert got.settings is None
    assert "line" in got.problems[0].what and "cloud-init schema" in got.problems[0].fix


def test_binary_and_huge_user_data_are_refused_with_a_fix() -> None:
    binary = extract_settings(b"\xff\xfe\x00\x01" * 10)
    assert "binary" in binary.problems[0].what
    huge = extract_settings(b"#cloud-config\n" + b"a" * (MAX_USER_DATA_BYTES + 1))
    assert "at most" in huge.problems[0].what and "64 KiB" in huge.problems[0].fix


def test_gzip_bomb_is_refused() -> None:
    bomb = gzip.compress(b"#cloud-config\n" + b" " * (8 << 20))
    assert "4 MiB" in extract_settings(bomb).problems[0].what


def test_wrong_types_keep_the_good_fields() -> None:
    doc = b"#cloud-config\nkiln:\n  profile: qwen3-8b\n  instances: many\n  objective: fastest\n  profle: x\n"
    resolved = merge(layers_from_inputs(RawInputs(user_data=doc)))
    assert resolved.choice.profile == "qwen3-8b"
    assert resolved.choice.instances is None and resolved.choice.objective is None
    fields = {p.field: p for p in resolved.problems}
    assert "integer" in fields["instances"].fix
    assert "throughput or latency" in fields["objective"].fix
    assert fields["profle"].fix == "did you mean `profile`?"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_never_raise(data: bytes) -> None:
    merge(layers_from_inputs(RawInputs(user_data=data, local_file=data.decode("latin-1"))))


yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
yaml_values = st.recursive(yaml_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["profile", "model", "objective", "instances", "max_model_len",
                                        "tensor_parallel_size", "quantization", "speculative_decoding",
                                        "api_key", "price_per_hour", "gpu_memory_utilization", "other"]),
                       yaml_values, max_size=8))
def test_random_settings_never_raise(settings_doc: dict[str, object]) -> None:
    text = "#cloud-config\n" + yaml.safe_dump({"kiln": settings_doc})
    resolved = merge(layers_from_inputs(RawInputs(user_data=text.encode())))
    for problem in resolved.problems:
        assert problem.what and problem.fix


def test_a_key_given_twice_is_a_problem_with_its_fix_and_the_rest_applies() -> None:
    key = "kiln-shared-key-0123456789"
    doc = f"#cloud-config\nkiln:\n  profile: qwen3-8b\n  api_key: {key}\n  api_keys: {{ci: {key}}}\n".encode()
    resolved = merge(layers_from_inputs(RawInputs(user_data=doc)))
    assert resolved.choice.profile == "qwen3-8b" and resolved.choice.api_key is None
    assert resolved.choice.api_keys is not None and resolved.choice.api_keys["ci"].key == key
    [problem] = resolved.problems
    assert problem.field == "api_key" and "ci" in problem.what and problem.fix and key not in problem.text()
    twice = merge(layers_from_inputs(RawInputs(user_data=f"#cloud-config\nkiln:\n  api_keys: {{a: {key}, b: {key}}}\n"
                                               .encode())))
    assert twice.choice.api_keys is not None and list(twice.choice.api_keys) == ["a"]
    assert [p.field for p in twice.problems] == ["api_keys"] and "b" in twice.problems[0].what
    # The same key from two sources: user-data's api_key, the machine's file's api_keys.
    across = merge(layers_from_inputs(RawInputs(user_data=f"#cloud-config\nkiln:\n  api_key: {key}\n".encode(),
                                                local_file=f"api_keys: {{ci: {key}}}\n")))
    assert across.choice.api_key is None and across.choice.api_keys is not None
    assert [(p.source, p.field) for p in across.problems] == [("user-data", "api_key")]


def test_a_prefix_longer_than_the_resolved_prompt_is_a_problem_at_validation() -> None:
    for workload, prompt in (({"prefix_len": 2000}, "1,024"), ({"preset": "chat", "prefix_len": 500}, "230")):
        layer = validate_fields({"workload": workload, "objective": "latency"}, source="user-data")
        assert "workload" not in layer.values and layer.values["objective"] == "latency"
        [problem] = layer.problems
        assert problem.field == "workload" and "prefix_len" in problem.what and prompt in problem.what
        assert "input_len" in problem.what and problem.fix
    assert validate_fields({"workload": {"prefix_len": 2000, "input_len": 4096}}, source="u").values["workload"]
    assert validate_fields({"workload": {"preset": "agent", "prefix_len": 8000}}, source="u").values["workload"]


def test_write_files_that_is_not_a_list_is_a_problem() -> None:
    for value in ("5", "true", "{path: /etc/kiln/kiln.yaml}"):
        got = extract_settings(f"#cloud-config\nwrite_files: {value}\nkiln:\n  profile: qwen3-8b\n".encode())
        assert [p.field for p in got.problems] == ["write_files"] and got.problems[0].fix
        assert got.settings == {"profile": "qwen3-8b"}  # the rest is still read
