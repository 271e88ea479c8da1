#!/usr/bin/env python3
"""A second short-text classification set, for checking that a recipe tuned on package sections
is general: which of 12 languages a translated message of a Debian program is in.

Reads the gettext catalogues every Debian system carries (/usr/share/locale/LANG/LC_MESSAGES/*.mo)
for 12 Latin-script languages, keeps each distinct translation of 8-120 characters with at least
one 3-letter word, shuffles (seed 3) and keeps up to 3,000 per language, and writes a TSV as
`trellis prepare --task classify` reads it (header `text<TAB>label`). Texts are short, often
one to five words, and GPT-2's English BPE cuts them into rare pieces: a character n-gram Naive
Bayes beats a bag of BPE tokens here, as on the held-back set issue 23 names.

Usage: langid_data.py OUT.tsv
"""
import gettext
import glob
import random
import re
import sys
from collections import Counter

LANGS = ["de", "fr", "es", "it", "pt_BR", "nl", "sv", "pl", "cs", "da", "fi", "ro"]
PER_LANGUAGE = 3000


def translations(lang):
    """The language's distinct short translations, in catalogue order."""
    seen, kept = set(), []
    for path in sorted(glob.glob(f"/usr/share/locale/{lang}/LC_MESSAGES/*.mo")):
        try:
            with open(path, "rb") as f:
                catalogue = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeDecodeError, IndexError):
            continue  # a few catalogues have no charset for non-ASCII text or a bad header
        for text in catalogue.values():
            if not isinstance(text, str):
                continue
            text = re.sub(r"\s+", " ", text).strip()
            if 8 <= len(text) <= 120 and re.search(r"[A-Za-zÀ-ž]{3}", text) and text not in seen:
                seen.add(text)
                kept.append(text)
    return kept


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = [(text, lang) for lang in LANGS for text in translations(lang)]
    random.seed(3)
    random.shuffle(rows)
    kept, per = [], Counter()
    for text, lang in rows:
        if per[lang] < PER_LANGUAGE:
            per[lang] += 1
            kept.append((text, lang))
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write("text\tlabel\n")
        f.writelines(f"{text}\t{lang}\n" for text, lang in kept)
    print(f"langid_data: {len(kept)} texts, {len(per)} languages -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
