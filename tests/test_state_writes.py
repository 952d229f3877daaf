"""Files run.sh and the batch job write while other processes of the same run may write them too
(issue 38): each is written under a name of its writer's own and renamed into place, so that many
services of one image started at once neither collide on a temporary file nor leave a state file
half-written. run/'s files are sourced on their own; the runtime is a STAND-IN (a bash function
that prints an image's directory list slowly: a program, as the runtime is, since bash makes a
program's redirections in its child, where $BASHPID is the child's)."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((REPO / "run").rglob("*.sh")) + [REPO / "compose2sif" / "batch_job.sh"]


def test_no_script_names_a_temporary_file_by_its_pid_or_a_fixed_name():
    """$$ is the script's pid in every subshell, so parallel subshells (services of one image started
    at once) would share such a name; a fixed `.tmp` name is shared by every writer."""
    shared = re.compile(r'''\.\$\$|\$\$\.|\$\{\$\}|(?<!BASHPID)\.tmp["'\s]''')
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in SCRIPTS
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if shared.search(line) and not line.lstrip().startswith("#")]
    assert found == []


def _bash(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", "-c", f"source {REPO}/run/lib/core.sh && source {REPO}/run/lib/runtime.sh && "
                           + script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "RUNDIR": str(tmp_path)})


def test_many_writers_of_one_state_file_leave_it_whole(tmp_path):
    """12 subshells write one file 100 times each (a line of 4 KB naming the writer and round) while
    a reader reads it: every read is one whole line, no writer says a word, nothing is left beside it."""
    script = r'''
        writers=()
        for w in $(seq 12); do
            (for r in $(seq 100); do write_lines "$RUNDIR/state" "$w $r $(printf 'x%.0s' $(seq 4000))" || exit 1; done) &
            writers+=($!)
        done
        (until [ -e "$RUNDIR/done" ]; do  # once there, it is never seen empty nor cut
            line=""
            [ -e "$RUNDIR/state" ] && { IFS= read -r line <"$RUNDIR/state"; echo "${#line}"; } 2>/dev/null
        done) >"$RUNDIR/reads" &
        reader=$!
        wait "${writers[@]}"
        : >"$RUNDIR/done"
        wait "$reader"
    '''
    done = _bash(script, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    whole = {len(f"{w} {r} ") + 4000 for w in range(1, 13) for r in range(1, 101)}
    lengths = [int(n) for n in (tmp_path / "reads").read_text().split()]
    assert lengths and all(n in whole for n in lengths), sorted(set(lengths) - whole)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done", "reads", "state"]


def test_services_of_one_image_started_at_once_share_its_directory_list(tmp_path):
    """shadow_image_dirs (setuid nodes) lists an image's directories once per SIF; 12 services of one
    image starting together each find it missing and list it: the STAND-IN runtime prints slowly,
    so the writers overlap. No `mv: cannot stat`, every overlay gets every directory, the list whole."""
    (tmp_path / "img.sif").write_text("")
    standin = tmp_path / "standin-runtime"  # exec SIF find / ...: the image's directories, NUL-separated, slowly
    standin.write_text("#!/bin/bash\nfor d in /usr /usr/lib /var /var/lib/app /opt/x; do printf '%s\\0' \"$d\"; "
                       "sleep 0.02; done\n")
    standin.chmod(0o755)
    script = r'''
        RT="$RUNDIR/standin-runtime" RT_MODE=setuid S_SIF="$RUNDIR/img.sif"
        for s in $(seq 12); do shadow_image_dirs "$RUNDIR/overlay$s" & done
        wait
    '''
    done = _bash(script, tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (tmp_path / "img.sif.dirs").read_bytes() == b"/usr\0/usr/lib\0/var\0/var/lib/app\0/opt/x\0"
    for s in range(1, 13):
        upper = tmp_path / f"overlay{s}" / "upper"
        assert (upper / "var" / "lib" / "app").is_dir() and (upper / "opt" / "x").is_dir(), s
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("img.sif.dirs.")]
