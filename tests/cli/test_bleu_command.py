"""`trellis bleu`: one JSON line with sacreBLEU's corpus BLEU and chrF; bad input is one error line.

Expected values are sacreBLEU's published ones for its README example (README.md, "Using SacreBLEU
from Python": BLEU 48.53 with two reference sets, chrF2 59.73; test/test_bleu.py: 48.530827)."""
import json
import os

from trellis_test import check, expect_error, fresh_dir, run


def write(path, lines, end="\n"):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(end.join(lines) + end)
    return path


d = fresh_dir("bleu")
hyp = write(os.path.join(d, "hyp.txt"), ["The dog bit the man.", "It wasn't surprising.",
                                         "The man had just bitten him."])
ref1 = write(os.path.join(d, "ref1.txt"), ["The dog bit the man.", "It was not unexpected.",
                                           "The man bit him first."])
ref2 = write(os.path.join(d, "ref2.txt"), ["The dog had bit the man.", "No one was surprised.",
                                           "The man had bitten the dog."])

out, err = run(["bleu", "--ref", ref1, "--ref", ref2, "--hyp", hyp])
lines = out.splitlines()
check(len(lines) == 1, f"one output line: {out!r}")
res = json.loads(lines[0])
check(sorted(res) == ["bleu", "chrf"], f"keys bleu and chrf: {res}")
check(abs(res["bleu"] - 48.530827) < 1e-6, f"BLEU of sacreBLEU's README example ({res['bleu']:.6f})")
check(abs(res["chrf"] - 59.73) < 0.005, f"chrF2 of sacreBLEU's README example ({res['chrf']:.4f})")

# CRLF line endings and trailing blanks are stripped as sacreBLEU's command line does.
crlf = write(os.path.join(d, "hyp_crlf.txt"), ["The dog bit the man.  ", "It wasn't surprising.",
                                              "The man had just bitten him.\t"], end="\r\n")
res2 = json.loads(run(["bleu", "--ref", ref1, "--ref", ref2, "--hyp", crlf])[0])
check(res2 == res, "CRLF endings and trailing whitespace do not change the scores")

# One reference set; identical text scores 100.
one = json.loads(run(["bleu", "--ref", ref1, "--hyp", hyp])[0])
check(one["bleu"] < res["bleu"] and one["chrf"] < res["chrf"],
      f"one reference set scores lower than two ({one})")
same = json.loads(run(["bleu", "--ref", ref1, "--hyp", ref1])[0])
check(abs(same["bleu"] - 100) < 1e-9 and abs(same["chrf"] - 100) < 1e-9,
      f"a text against itself scores 100: {same}")


short = write(os.path.join(d, "short.txt"), ["The dog bit the man.", "It was not unexpected."])
expect_error(["bleu", "--ref", ref1, "--ref", short, "--hyp", hyp], short, hyp, "2 lines", "has 3")
expect_error(["bleu", "--ref", ref1, "--hyp", short], ref1, short)
expect_error(["bleu", "--ref", os.path.join(d, "missing.txt"), "--hyp", hyp], "missing.txt")
bad = os.path.join(d, "bad_utf8.txt")
with open(bad, "wb") as f:
    f.write(b"The dog bit the man.\nIt was \xff not.\nThe man.\n")
expect_error(["bleu", "--ref", ref1, "--hyp", bad], bad, "hypothesis line 2", "UTF-8")
_, err = run(["bleu", "--hyp", hyp], expect=2)
check("--ref" in err, "--ref is required")
