#!/usr/bin/env bash
# Headless GTKWave screenshot of a waveform, for docs and bug reports:
#
#   scripts/wave_screenshot.sh [options] WAVE.vcd|WAVE.fst OUT.png [SIGNAL-GLOB...]
#
# Opens WAVE in GTKWave on a virtual X display (xvfb-run), shows the signals whose
# full hierarchical names match the globs (shell patterns on dotted names such as
# 'SystemC.mxu0.array.pe_7_*.psum'; a glob without a dot also matches the last
# name component; no glob = every signal, up to --max-signals), zooms to fit and
# saves the window as OUT.png. Signals appear in glob order, then file order.
# 1-bit signals are drawn as wires, vectors in signed decimal, reals (fp32 partial sums)
# as analog step traces two rows tall.
#
# Options:
#   --size WxH           window size in pixels (default 1400 wide, tall enough for the traces)
#   --max-signals N      at most N traces (default 48)
#   --save FILE.gtkw     also keep the generated GTKWave save file: open it later
#                        with `gtkwave FILE.gtkw` for the same view
#   --gtkw FILE.gtkw     use this save file instead of globs (its signals, formats, size)
#   --list               print the signal names in WAVE and exit (no X needed)
#
# Exit status: 0 done; 2 bad usage or input (missing file, no matching signal);
# 3 a needed tool is missing (gtkwave, xvfb-run, xauth, xwd, convert: see
# scripts/packages.txt) or GTKWave failed to show the window.
# Where it comes from: `tpusim run --wave FILE.vcd|.fst` and tests/scripts/mxu_wave.
set -euo pipefail

prog=wave_screenshot.sh
die() { echo "$prog: error: $*" >&2; exit 2; }
die_tool() { echo "$prog: error: $*" >&2; exit 3; }
usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

size=1400x900
size_given=0
max_signals=48
save=""
gtkw_in=""
list=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) [[ $# -ge 2 && $2 =~ ^[0-9]{3,4}x[0-9]{3,4}$ ]] || die "--size: expected WxH, e.g. 1400x900"
            size=$2; size_given=1; shift 2 ;;
    --max-signals) [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--max-signals: expected a positive integer"
                   max_signals=$2; shift 2 ;;
    --save) [[ $# -ge 2 ]] || die "--save: expected FILE.gtkw"; save=$2; shift 2 ;;
    --gtkw) [[ $# -ge 2 ]] || die "--gtkw: expected FILE.gtkw"; gtkw_in=$2; shift 2 ;;
    --list) list=1; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || usage
wave=$1; shift
[[ -f $wave && -r $wave ]] || die "$wave: no such readable file"
case $wave in
  *.vcd|*.fst) ;;
  *) die "$wave: expected a .vcd or .fst waveform" ;;
esac
wave_abs=$(cd "$(dirname "$wave")" && pwd)/$(basename "$wave")

# The header (declarations) as VCD text; fst2vcd streams the whole file, so stop
# reading at the end of the declarations.
header() {
  if [[ $wave == *.fst ]]; then
    command -v fst2vcd >/dev/null || die_tool "fst2vcd not found (Debian package gtkwave)"
    { fst2vcd "$wave_abs" 2>/dev/null || true; } | sed '/\$enddefinitions/q'
  else
    sed '/\$enddefinitions/q' "$wave_abs"
  fi
}

# One line per variable: TYPE FULL.NAME[RANGE]  (the name GTKWave shows and finds).
signals=$(header | awk '
  $1 == "$scope" { stack[++depth] = $3; next }
  $1 == "$upscope" { depth--; next }
  $1 == "$var" {
    name = ""
    for (i = 1; i <= depth; i++) name = name stack[i] "."
    name = name $5
    if ($6 != "$end" && $6 ~ /^\[/) name = name $6
    print $2, name
  }')
[[ -n $signals ]] || die "$wave: no signal declarations found (not a VCD/FST waveform?)"

if [[ $list == 1 ]]; then
  echo "$signals" | awk '{ print $2 }'
  exit 0
fi

[[ $# -ge 1 ]] || usage
out=$1; shift
[[ $out == *.png ]] || die "$out: the screenshot is written as PNG; name it .png"
out_dir=$(dirname "$out")
[[ -d $out_dir && -w $out_dir ]] || die "$out: directory $out_dir does not exist or is not writable"
out_abs=$(cd "$out_dir" && pwd)/$(basename "$out")
[[ -z $gtkw_in || -r $gtkw_in ]] || die "$gtkw_in: no such readable file"
[[ -z $gtkw_in || $# -eq 0 ]] || die "--gtkw and signal globs exclude each other"

for tool in gtkwave xvfb-run xauth xwd convert; do
  command -v "$tool" >/dev/null ||
    die_tool "$tool not found; install the packages of scripts/packages.txt (./scripts/install-deps.sh)"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/wave_screenshot.XXXXXX")
trap 'rm -rf "$work"' EXIT

width=${size%x*}
height=${size#*x}
gtkw=$work/view.gtkw
selected=()
if [[ -n $gtkw_in ]]; then
  # Point the given save file at this waveform, keep everything else; its [size]
  # is the window's unless --size says otherwise.
  grep -v '^\[dumpfile' "$gtkw_in" | sed "1i [dumpfile] \"$wave_abs\"" > "$gtkw"
  if [[ $size_given == 0 ]] && read -r _ w h < <(grep -m1 '^\[size\]' "$gtkw_in"); then
    [[ $w =~ ^[0-9]+$ && $h =~ ^[0-9]+$ ]] && width=$w height=$h
  fi
else
  # Select: glob order first, file order within a glob, each signal once.
  declare -A picked=()
  [[ $# -gt 0 ]] || set -- '*'
  for glob in "$@"; do
    while read -r type name; do
      base=${name%%\[*}
      leaf=${base##*.}
      if [[ $base == $glob || $name == $glob || ( $glob != *.* && $leaf == $glob ) ]]; then
        if [[ -z ${picked[$name]:-} ]]; then
          picked[$name]=1
          selected+=("$type $name")
        fi
      fi
    done <<< "$signals"
  done
  [[ ${#selected[@]} -gt 0 ]] || die "$wave: no signal matches $* (list them with --list)"
  if [[ ${#selected[@]} -gt $max_signals ]]; then
    echo "$prog: note: ${#selected[@]} signals match; showing the first $max_signals (--max-signals)" >&2
    selected=("${selected[@]:0:$max_signals}")
  fi
  # Label each trace by its name below the prefix all selected names share
  # (GTKWave would show only the last component: eight rows all called "psum").
  prefix=${selected[0]#* }
  prefix=${prefix%%\[*}
  prefix=${prefix%.*}.
  for entry in "${selected[@]}"; do
    name=${entry#* }
    while [[ $prefix != . && $name != "$prefix"* ]]; do
      prefix=${prefix%.}
      [[ $prefix == *.* ]] && prefix=${prefix%.*}. || prefix=.
    done
  done
  # Fit the window to the rows (about 21 px each below 140 px of menus and ruler)
  # unless --size was given.
  if [[ $size_given == 0 ]]; then
    rows=0
    for entry in "${selected[@]}"; do [[ ${entry%% *} == real ]] && rows=$((rows + 2)) || rows=$((rows + 1)); done
    height=$((150 + rows * 21))
    ((height < 300)) && height=300
    ((height > 1400)) && height=1400
  fi
  # GTKWave trace flags (analyzer.h): 0x20 right-justify, 0x4 decimal, 0x400 signed
  # (a 32-bit -1, "no op", reads -1, not 4294967295), 0x8 binary,
  # 0x8000 analog step; a 0x20000 row below stretches the analog trace above it.
  {
    echo "[dumpfile] \"$wave_abs\""
    echo "[size] $width $height"
    echo "[pos] 0 0"
    echo "[sst_expanded] 0"
    echo "[signals_width] 320"
    for entry in "${selected[@]}"; do
      type=${entry%% *}
      name=${entry#* }
      label=${name#"$prefix"}
      label=${label%%\[*}
      case $type in
        real) printf '@8024\n+{%s} %s\n@20000\n-\n' "$label" "$name" ;;
        *) if [[ $name == *\[* ]]; then printf '@424\n+{%s} %s\n' "$label" "$name"
           else printf '@28\n+{%s} %s\n' "$label" "$name"; fi ;;
      esac
    done
  } > "$gtkw"
fi
[[ -z $save ]] || cp "$gtkw" "$save"

# Zoom to fit once the traces are in, then tell the capture side the view is ready.
cat > "$work/view.tcl" <<EOF
gtkwave::/Time/Zoom/Zoom_Full
gtkwave::setWindowStartTime 0
set f [open "$work/ready" w]
close \$f
EOF

cat > "$work/rc" <<EOF
splash_disable on
hide_sst on
initial_window_x $width
initial_window_y $height
initial_window_xpos 0
initial_window_ypos 0
enable_vert_grid on
use_big_fonts off
hier_max_level 0
EOF

# Inside the virtual display: start GTKWave, wait for the ready mark and the
# window, let it paint, grab the window (xwd), convert to PNG.
cat > "$work/capture.sh" <<'EOF'
#!/usr/bin/env bash
set -u
work=$1 wave=$2 out=$3
gtkwave --rcfile "$work/rc" --script "$work/view.tcl" "$wave" "$work/view.gtkw" > "$work/gtkwave.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do
  [[ -e $work/ready ]] && break
  kill -0 "$pid" 2>/dev/null || { echo "gtkwave exited early" >> "$work/gtkwave.log"; exit 3; }
  sleep 0.1
done
[[ -e $work/ready ]] || { kill "$pid"; exit 3; }
win=""
for _ in $(seq 1 50); do
  win=$(xwininfo -root -tree 2>/dev/null | awk '/GTKWave/ && $1 ~ /^0x/ { print $1; exit }')
  [[ -n $win ]] && break
  sleep 0.1
done
sleep 1.5   # the zoom's redraw happens after the script returns
if [[ -n $win ]]; then xwd -silent -id "$win" > "$work/shot.xwd"; else xwd -silent -root > "$work/shot.xwd"; fi
rc=$?
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
[[ $rc -eq 0 ]] || exit 3
convert "$work/shot.xwd" -strip "PNG24:$out" || exit 3
EOF
chmod +x "$work/capture.sh"

if ! xvfb-run -a -s "-screen 0 $((width + 16))x$((height + 16))x24 -nolisten tcp" \
      "$work/capture.sh" "$work" "$wave_abs" "$out_abs"; then
  echo "$prog: error: GTKWave did not produce a screenshot of $wave; its log:" >&2
  sed 's/^/  /' "$work/gtkwave.log" >&2 2>/dev/null || true
  exit 3
fi
[[ -s $out_abs ]] || die_tool "no screenshot written to $out"
if [[ -n $gtkw_in ]]; then echo "$prog: wrote $out (view of $gtkw_in)" >&2
else echo "$prog: wrote $out (${#selected[@]} signals)" >&2; fi
