# Sourced by the GPU-host scripts: unpack carried wheels (.whl/, .whl-svc/; never committed) beside the
# host's preinstalled torch, put this checkout on PYTHONPATH, and make $OUT.
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl $(ls .whl-svc/*.whl 2>/dev/null) || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
