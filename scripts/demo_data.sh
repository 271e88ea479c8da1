#!/usr/bin/env bash
# Builds demo task data from this machine alone (Debian's package lists and message catalogues):
#   OUT/packages.tsv  text<TAB>label: a package's description -> its Debian section (the 10
#                     largest sections, at most 4000 descriptions each, duplicates dropped)
#   OUT/classify      `trellis prepare --task classify` of packages.tsv
#   OUT/translate     `trellis prepare --task translate` of the German .mo catalogues
#                     (/usr/share/locale/de/LC_MESSAGES), English msgid -> German msgstr, in one
#                     SentencePiece vocabulary of 8,000 pieces shared by both sides, pairs of at
#                     most 32 tokens a side (99% of them; the rest are skipped and counted)
# Usage: scripts/demo_data.sh OUT        (trellis binary: ${TRELLIS_BIN:-build/trellis})
set -euo pipefail

out=${1:?usage: scripts/demo_data.sh OUT}
trellis=${TRELLIS_BIN:-build/trellis}
per_class=${PER_CLASS:-4000}
max_len=${MAX_LEN:-32}
[[ -x "$trellis" ]] || { echo "demo_data: no trellis binary at $trellis (set TRELLIS_BIN)" >&2; exit 1; }
mkdir -p "$out"

# --- packages.tsv ---
# The Packages lists hold each package's one-line description (the long ones live in
# Translation-en lists, which apt here does not fetch); dumpavail prints every package once.
if ! compgen -G "/var/lib/apt/lists/*_Packages*" >/dev/null; then
  echo "demo_data: the apt package lists are empty: run 'apt-get update' first" >&2
  exit 1
fi
start=$SECONDS
# One "random-key<TAB>section<TAB>description" row per package; the seeded random key gives a
# fixed shuffle, so the per-class cap takes a spread of packages, not the alphabet's start.
apt-cache dumpavail | awk -F': ' -v OFS='\t' '
  BEGIN { srand(1337) }
  /^Package: / { section = ""; text = "" }
  /^Section: / { section = $2; sub(/^(contrib|non-free|non-free-firmware)\//, "", section) }
  /^Description: / { text = substr($0, 14); gsub(/\t/, " ", text) }
  /^$/ { if (section != "" && text != "") print rand(), section, text; section = ""; text = "" }
  END { if (section != "" && text != "") print rand(), section, text }
' | sort -t$'\t' -k3,3 -u | sort -t$'\t' -k1,1g >"$out/packages.all"
awk -F'\t' '{ n[$2]++ } END { for (s in n) print n[s] "\t" s }' "$out/packages.all" |
  sort -rn | head -10 | cut -f2 >"$out/sections.txt"
{
  printf 'text\tlabel\n'
  awk -F'\t' -v cap="$per_class" -v OFS='\t' '
    NR == FNR { keep[$1] = 1; next }
    ($2 in keep) && taken[$2]++ < cap { print $3, $2 }
  ' "$out/sections.txt" "$out/packages.all"
} >"$out/packages.tsv"
rm -f "$out/packages.all" "$out/sections.txt"
rows=$(($(wc -l <"$out/packages.tsv") - 1))
echo "demo_data: $out/packages.tsv: $rows descriptions in $((SECONDS - start)) s; per section:"
tail -n +2 "$out/packages.tsv" | cut -f2 | sort | uniq -c | sort -rn | sed 's/^/  /'

# --- classification ---
start=$SECONDS
"$trellis" prepare --task classify --input "$out/packages.tsv" --out "$out/classify"
echo "demo_data: classify prepared in $((SECONDS - start)) s"

# --- translation ---
catalogues=(/usr/share/locale/de/LC_MESSAGES/*.mo)
if [[ ! -e "${catalogues[0]}" ]]; then
  echo "demo_data: no German catalogues in /usr/share/locale/de/LC_MESSAGES; skipping translate" >&2
  exit 1
fi
start=$SECONDS
# Catalogues hold some long help texts; --skip-long drops (and counts) those instead of refusing.
"$trellis" prepare --task translate --input "${catalogues[@]}" --out "$out/translate" \
  --tokenizer sentencepiece --vocab-size 8000 --max-len "$max_len" --skip-long
echo "demo_data: translate prepared from ${#catalogues[@]} catalogues in $((SECONDS - start)) s"

echo "demo_data: built"
du -sh "$out/packages.tsv" "$out/classify" "$out/translate" | sed 's/^/  /'
