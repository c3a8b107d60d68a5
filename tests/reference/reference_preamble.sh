# Sourced by the char_gpt reference tests: skips (exit 0, "SKIPPED: ...")
# without the corpus or a python3 that imports torch, and clears the rank
# variables of any job the test itself runs in. Sets $out, a folder removed
# on exit.
if [ ! -f /usr/share/games/fortunes/computers ]; then
  echo "SKIPPED: /usr/share/games/fortunes/computers is absent (scripts/setup.sh installs fortunes)"; exit 0
fi
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 cannot import torch (scripts/setup.sh installs python3-torch)"; exit 0
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN
