"""Plumbing tests of the regen scripts that cannot run on the real upstream code here:
dsml_cases.py against a toy encoder (NOT encoding.py) and waste_oracle.py against a toy
`tools/ds41_ref.py` (NOT WASTE's). Run: python3 -m unittest discover -s goldens/regen -p 'test_regen*'
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
        return subprocess.run([sys.executable, str(HERE / "dsml_cases.py"), "--encoding", str(self.root / "encoding.py"), *args],
                              capture_output=True, text=True)

    def test_refuses_unpinned_encoder(self):
        proc = self.run_script("--official-cases", str(self.root / "official"), "--out", str(self.root / "o"))
        self.assertEqual(proc.returncode, 2)
        self.assertIn("not the pinned", proc.stderr)

    def test_official_cases_probes_and_project_cases(self):
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
        # project cases: check mode reports a stale expected output, --write fixes it
        proj = self.root / "proj"
        proj.mkdir()
        (proj / "a.json").write_text(json.dumps([{"role": "user", "content": 1}]))
        (proj / "a.txt").write_text("stale")
        proc = self.run_script("--allow-unpinned", "--cases", str(proj / "*.json"))
        self.assertEqual(proc.returncode, 1)
        self.assertIn("differs from encoding.py", proc.stdout)
        proc = self.run_script("--allow-unpinned", "--cases", str(proj / "*.json"), "--write")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = self.run_script("--allow-unpinned", "--cases", str(proj / "*.json"))
        self.assertEqual(proc.returncode, 0, proc.stdout)
