"""The per-service loopback in convert and run.sh (issue 23, integration; docs/interception.md).

convert puts the tracer (compose2sif/intercept/loopback*.c, built into the package when it was
installed: setup.py) into bin/x86_64/c2s-loopback;
run.sh's run/lib/isolation.sh chooses the mode and starts entries, probes and execs under it.
Here, on this machine: the real tracer runs a STAND-IN SERVER (a Python one-liner named
`c2s-standin-*`, binding 0.0.0.0:80 as an image's server does) in place of a service's entry, and
run.sh's own functions read its record; the real forwarder relays to where the tracer put the port.
The runtime that `up` asks to run `c2s-loopback --check` is a STAND-IN RUNTIME (a bash script that
runs the command it is given outside any container)."""
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import kill_groups, run_lib

from compose2sif import helpers

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "run"
ENGINE_MARKER = "# ---- the engine (the same for every project"
BLOCK = "127.78.8"

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                       reason="the package builds c2s-loopback for x86_64 Linux only"),
    # its stand-in server holds port 8000 on its own address, which test_published_ports's
    # 0.0.0.0:8000 would clash with: the two modules run on one worker, one after the other
    pytest.mark.xdist_group("published-ports"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """web: an image's server on port 8000 that nobody can tell anything, published on another number."""
    root = tmp_path_factory.mktemp("icpt")
    published = free_port()
    (root / "compose.yaml").write_text(f"""
services:
  web:
    image: busybox
    ports: ["{published}:8000"]
  a:
    image: busybox
    command: ["it's", "$$HOME", "a;b"]
  z:
    image: busybox
    ports: ["{published + 1}:{published + 1}"]
  zlow:
    image: busybox
    ports: ["{published + 2}:80"]
  zz:
    image: busybox
    network_mode: host
  zzeph:
    image: busybox
    ports: ["9000", "81"]
""")
    proc = subprocess.run(["python3", "-m", "compose2sif", "-f", str(root / "compose.yaml"), "convert", "--offline",
                           "--address-block", f"{BLOCK}.0/24", "--port-base", "24000", "-o", str(root / "out")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    text = (root / "out" / "run.sh").read_text()
    (root / "out" / "header.sh").write_text(text[:text.index(ENGINE_MARKER)])
    (root / "out" / "convert.err").write_text(proc.stderr)
    return root / "out", published


@pytest.fixture
def project(converted, tmp_path):
    out, published = converted
    shutil.copytree(out, tmp_path / "out", symlinks=True)
    for sub in ("state/run/loopback", "state/logs"):
        (tmp_path / "out" / sub).mkdir(parents=True)
    started = []
    yield tmp_path, published, started
    run_lib(tmp_path, "stop_forwarders web")
    kill_groups(started)




def test_convert_puts_the_tracer_beside_run_sh(converted):
    out, _ = converted
    tracer = out / "bin" / "x86_64" / "c2s-loopback"
    assert tracer.read_bytes().startswith(b"\x7fELF") and os.access(tracer, os.X_OK)
    assert subprocess.run([str(tracer), "--check", "--addr", f"{BLOCK}.9"], capture_output=True).returncode == 0
    run_sh = (out / "run.sh").read_text()
    assert "LOOPBACK_BLOCK=24050-24099" in run_sh and f"S_OWN_ADDRESS={BLOCK}." in run_sh
    assert "carries no built helpers" not in (out / "convert.err").read_text()


def test_a_compose2sif_without_built_helpers_warns_once_and_writes_none(tmp_path, monkeypatch):
    """A source tree that pip did not install has no compose2sif/helpers/: convert says so in one
    warning with the fix, writes no helper, and plans for the plan-time knobs alone."""
    monkeypatch.setattr(helpers, "PACKAGED", str(tmp_path / "none"))
    (tmp_path / "compose.yaml").write_text("services:\n  a:\n    image: busybox\n    ports: ['127.0.0.1:18091:8080']\n")
    from compose2sif import cli
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        cli.main(["convert", "--offline", "-o", str(tmp_path / "out")])
    assert done.value.code in (0, None)
    plan = (tmp_path / "out" / "plan.json").read_text()
    assert plan.count("carries no built helpers") == 1 and "python3 -m pip install ." in plan
    assert not (tmp_path / "out" / "bin").exists()


def test_convert_compiles_nothing_and_writes_the_packaged_helpers(tmp_path):
    """Convert copies the helpers the package build made; a compiler on PATH is never asked for
    (STAND-IN COMPILERS: cc, gcc, clang, zig and ld that record their call and fail)."""
    standins = tmp_path / "standin-compilers"
    standins.mkdir()
    for name in ("cc", "gcc", "clang", "zig", "ld", "musl-gcc"):
        (standins / name).write_text(f'#!/bin/sh\necho {name} "$@" >>"{tmp_path}/compiled"\nexit 1\n')
        (standins / name).chmod(0o755)
    (tmp_path / "compose.yaml").write_text("services:\n  a:\n    image: busybox\n    ports: ['127.0.0.1:18092:8080']\n")
    env = {**os.environ, "PATH": f"{standins}:{os.environ['PATH']}", "CC": str(standins / "cc")}
    done = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(tmp_path / "out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "compiled").exists(), (tmp_path / "compiled").read_text()
    listing = json.loads((tmp_path / "out" / "bin" / "helpers.json").read_text())
    assert {(h["arch"], h["name"]) for h in listing["helpers"]} == \
        {("x86_64", "c2s-forward"), ("x86_64", "c2s-loopback"), ("aarch64", "c2s-forward")}
    for helper in listing["helpers"]:
        written = tmp_path / "out" / "bin" / helper["arch"] / helper["name"]
        assert written.read_bytes() == (Path(helpers.PACKAGED) / helper["arch"] / helper["name"]).read_bytes()
        assert hashlib.sha256(written.read_bytes()).hexdigest() == helper["sha256"] and os.access(written, os.X_OK)
    assert listing["toolchain"].startswith("zig ") and "(PyPI ziglang)" in listing["toolchain"]
    said = subprocess.run([str(tmp_path / "out" / "bin" / "x86_64" / "c2s-forward"), "--version"],
                          capture_output=True, text=True)
    assert said.stdout.split() == ["c2s-forward", next(h["version"] for h in listing["helpers"]
                                                       if h["name"] == "c2s-forward")]


STANDIN_RUNTIME = """#!/bin/bash
# c2s-standin-runtime: a STAND-IN RUNTIME. `exec --bind SRC:DST:ro SIF CMD ARG...` runs CMD (DST
# being SRC) outside any container; nothing else is understood.
[ "$1" = exec ] && [ "$2" = --bind ] || exit 99
src=${3%%:*} dst=${3#*:} dst=${dst%:ro}
shift 4
[ "$1" = "$dst" ] && shift && exec "$src" "$@"
exit 98
"""


def test_up_chooses_the_loopback_where_the_check_passes_and_says_why_not_elsewhere(project):
    tmp_path, _, _ = project
    runtime = tmp_path / "c2s-standin-runtime"
    runtime.write_text(STANDIN_RUNTIME)
    runtime.chmod(0o755)
    (tmp_path / "out" / "sif").mkdir(exist_ok=True)
    (tmp_path / "out" / "sif" / "busybox.sif").write_text("a stand-in SIF: the stand-in runtime never reads it")
    choose = f'RT={runtime} && choose_isolation && echo "$ISOLATION|$ISOLATION_WHY" && cat "$RUNDIR/isolation"'
    auto = run_lib(tmp_path, choose, C2S_PORT_ISOLATION="auto")
    assert auto.returncode == 0, auto.stderr
    assert auto.stdout.startswith("intercept|ptrace+seccomp, kernel ")
    assert " auto intercept\n" in auto.stdout
    # kept: a second `up` does not ask again (the runtime is gone)
    again = run_lib(tmp_path, 'RT=/nonexistent && choose_isolation && echo "$ISOLATION"', C2S_PORT_ISOLATION="auto")
    assert again.stdout == "intercept\n"
    assert run_lib(tmp_path, 'isolation_mode && echo "$ISOLATION"').stdout == "intercept\n"
    # asked otherwise, the node is asked again: a check that fails is not the last one's success
    failing = run_lib(tmp_path, "RT=/bin/false && choose_isolation", C2S_PORT_ISOLATION="intercept")
    assert failing.returncode == 1
    assert failing.stderr == ("run.sh: up: C2S_PORT_ISOLATION=intercept, but c2s-loopback --check: it failed with "
                              "exit code 1\n")
    plan = run_lib(tmp_path, 'choose_isolation && echo "$ISOLATION|$ISOLATION_WHY"', C2S_PORT_ISOLATION="plan")
    assert plan.stdout == "plan|C2S_PORT_ISOLATION=plan\n" and plan.stderr == ""
    # a node of an architecture the package has no tracer for (as an aarch64 node sees this output):
    # one line, and the knobs
    (tmp_path / "out" / "bin" / "x86_64" / "c2s-loopback").rename(tmp_path / "out" / "bin" / "aarch64" / "c2s-loopback")
    other = run_lib(tmp_path, 'choose_isolation && echo "$ISOLATION"', C2S_PORT_ISOLATION="auto")
    assert other.stdout == "plan\n"
    assert other.stderr.split("] ", 1)[1] == ("port isolation: plan-time knobs only (compose2sif's package has no "
                                             "c2s-loopback for this node's architecture, x86_64 (only for aarch64)); "
                                             "nothing is isolated: any user of the node reaches every port of every "
                                             "service, and networks (internal ones too) do not keep services apart\n")
    # none at all (a compose2sif not installed by pip converted it): one line, and the knobs
    (tmp_path / "out" / "bin" / "aarch64" / "c2s-loopback").unlink()
    gone = run_lib(tmp_path, 'choose_isolation && echo "$ISOLATION"', C2S_PORT_ISOLATION="auto")
    assert gone.stdout == "plan\n"
    assert gone.stderr.count("\n") == 1 and "port isolation: plan-time knobs only (no bin/x86_64/c2s-loopback: the " \
        "compose2sif that converted this was not installed by pip" in gone.stderr
    forced = run_lib(tmp_path, "choose_isolation", C2S_PORT_ISOLATION="intercept")
    assert forced.returncode == 1 and forced.stderr.startswith("run.sh: up: C2S_PORT_ISOLATION=intercept, but no bin/")
    bad = run_lib(tmp_path, "choose_isolation", C2S_PORT_ISOLATION="docker")
    assert bad.returncode == 1 and bad.stderr == "run.sh: C2S_PORT_ISOLATION=docker: give auto, intercept or plan\n"


def node_pairs(tmp_path, port, target):
    """S_FORWARDS of a port published on all interfaces: each of the node's addresses, and the
    project's gateway (host.docker.internal), -> TARGET."""
    addresses = run_lib(tmp_path, 'node_addresses && echo "${NODE_ADDRESSES[*]} $GATEWAY"').stdout.split()
    assert addresses[0] == "127.0.0.1" and "0.0.0.0" not in addresses
    assert addresses[-1].startswith("127.") and addresses[-1].endswith(".1") and addresses[-1] != "127.0.0.1"
    return " ".join(f"{a}:{port} {target}" for a in addresses)


def test_a_port_published_on_its_own_number_is_its_forwarders_and_the_service_keeps_its_address(project):
    """Under the tracer the service binds its own address, as every other; the node's addresses get
    its published port from forwarders, one by one (never the wildcard, which would take the port
    from every other service)."""
    tmp_path, published, _ = project
    intercept(tmp_path)
    proc = run_lib(tmp_path, 'load_service z && echo "${S_ENDPOINTS[*]}" && echo "${S_FORWARDS[*]}" && traced true && '
                             'echo "${TRACED[*]}"')
    assert proc.returncode == 0, proc.stderr
    endpoint, forwards, words = proc.stdout.splitlines()
    own = run_lib(tmp_path, 'load_service z && echo "$S_OWN_ADDRESS"').stdout.strip()
    assert endpoint == f"{own}:{published + 1}?"
    assert forwards == node_pairs(tmp_path, published + 1, f"{own}:{published + 1}")
    assert "--keep" not in words


def answers(port: int) -> None:
    """Until a stand-in server answers on the node's 127.0.0.1:PORT (through a forwarder), 10 s at most."""
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
                assert answer.status == 200
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing answered on port {port}")


def intercept(tmp_path):
    (tmp_path / "out" / "state" / "run" / "isolation").write_text(f"{socket.gethostname()} auto intercept\nwhy\n")


def test_the_entry_probe_and_exec_run_under_the_tracer_with_words_quoted(project):
    tmp_path, _, _ = project
    plain = run_lib(tmp_path, 'load_service a && START_FLAGS=() && if loopback_start_flags; then echo traced; fi; '
                           'traced id -u && printf "<%s>" "${TRACED[@]}"')
    assert plain.stdout == "<id><-u>"
    intercept(tmp_path)
    proc = run_lib(tmp_path, 'write_hosts && load_service a && START_FLAGS=() && loopback_start_flags && '
                          'printf "<%s>" "${START_FLAGS[@]}" && echo && traced id -u && printf "<%s>" "${TRACED[@]}"')
    assert proc.returncode == 0, proc.stderr
    flags, words = proc.stdout.splitlines()
    run = tmp_path / "out" / "state" / "run"
    assert f"<{run}/a.traced:/.singularity.d/startscript:ro>" in flags
    assert f"<{run}/loopback:/.c2s/records>" in flags and f"<{run}/busybox.entry:/.c2s/entry:ro>" in flags
    # Docker's DNS is its resolver, as on a Docker network; the node's search and options kept
    state = tmp_path / "out" / "state"
    assert f"<{state}/resolv.conf:/etc/resolv.conf:ro>" in flags
    node = Path("/etc/resolv.conf").read_text().splitlines() if Path("/etc/resolv.conf").exists() else []
    kept = [line for line in node if line.split()[:1] in (["search"], ["domain"], ["options"])]
    assert (state / "resolv.conf").read_text().splitlines()[1:] == (
        ["nameserver 127.0.0.11", *kept] + ([] if any("ndots:" in line for line in kept) else ["options ndots:0"]))
    dns = run_lib(tmp_path, 'echo "$DNS_ENDPOINT"').stdout.strip()
    assert dns.startswith(f"{BLOCK}.1:")
    assert words == (f"</.c2s/loopback><--addr><{BLOCK}.2><--dns><{dns}><--record></.c2s/records/a><--peers>"
                     "</.c2s/records><--private><--share-ports><--><id><-u>")  # (zz is on the host network)
    wrapper = (run / "a.traced").read_text()
    assert wrapper.splitlines()[-1] == (f"exec '/.c2s/loopback' '--addr' '{BLOCK}.2' '--block' '24050-24099' "
                                        f"'--dns' '{dns}' '--record' '/.c2s/records/a' '--peers' '/.c2s/records' '--private' "
                                        "'--share-ports' '--' '/bin/sh' "
                                        "'/.c2s/entry' \"$@\"")
    entry = (run / "busybox.entry").read_text()
    assert 'eval "$C2S_LAUNCH"' in entry and "exec /.singularity.d/runscript" in entry


def test_a_host_network_service_keeps_the_nodes_network_and_shares_ports_with_own_addresses(project):
    """network_mode: host asks for the node's network as it is: nothing of it is relocated, and
    its execs run untraced. Its entry runs under --host-network alone, so that its wildcard binds
    share a port with the own-address binds of the others (--share-ports)."""
    tmp_path, _, _ = project
    intercept(tmp_path)
    proc = run_lib(tmp_path, 'load_service zz && START_FLAGS=() && if loopback_start_flags; then echo traced; fi; '
                             'traced id -u && printf "<%s>" "${TRACED[@]}"')
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "traced\n<id><-u>"
    wrapper = (tmp_path / "out" / "state" / "run" / "zz.traced").read_text()
    assert wrapper.splitlines()[-1] == "exec '/.c2s/loopback' '--host-network' '--' '/bin/sh' '/.c2s/entry' \"$@\""


def test_a_service_a_batch_job_runs_across_nodes_runs_untraced(project):
    """C2S_NODE_NETWORK (the batch job names the service spanning nodes): the other nodes reach
    its binds at this node's address, so it keeps the node's network as it is; the others do not."""
    tmp_path, _, _ = project
    intercept(tmp_path)
    script = ('for name in a z; do load_service "$name" && START_FLAGS=() && if loopback_start_flags; then '
              'echo "$name traced"; else echo "$name untraced"; fi; done')
    proc = run_lib(tmp_path, script, C2S_NODE_NETWORK="x a")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["a untraced", "z traced"]


def test_up_refuses_a_service_only_a_loopback_of_its_own_runs_where_it_would_run_untraced(project):
    tmp_path, _, _ = project
    header = tmp_path / "out" / "header.sh"
    line = "service 'a' listens on port 80 (seen in: ports), which an unprivileged user cannot bind; fix: X"
    before, _, after = header.read_text().partition("    S_NAME=a\n")
    assert after and "S_NEEDS_LOOPBACK=''" in after.split("\n}", 1)[0]  # service a's function
    header.write_text(before + "    S_NAME=a\n" + after.replace("S_NEEDS_LOOPBACK=''", "S_NEEDS_LOOPBACK=" + shlex.quote(line), 1))
    (tmp_path / "out" / "state" / "run" / "isolation").write_text(f"{socket.gethostname()} plan plan\nC2S_PORT_ISOLATION=plan\n")
    script = 'isolation_mode && refuse_untraceable a z; echo "rc=$?"'
    assert run_lib(tmp_path, script).stdout == "rc=0\n"  # not built yet: start_service says so
    sif = Path(run_lib(tmp_path, 'load_service a && echo "$S_SIF"').stdout.strip())
    sif.parent.mkdir(exist_ok=True)
    sif.write_text("")  # (nothing runs it)
    proc = run_lib(tmp_path, script)
    assert proc.stdout == "rc=1\n"
    assert proc.stderr == f"run.sh: up: {line} (port isolation: C2S_PORT_ISOLATION=plan)\n"
    intercept(tmp_path)
    proc = run_lib(tmp_path, script)
    assert (proc.stdout, proc.stderr) == ("rc=0\n", "")


def test_a_privileged_port_goes_where_the_plan_says_whatever_an_earlier_run_recorded(project):
    """convert gives each privileged port of a service its place on the block's top half (the
    tracer's --map): its forwarders relay there from the start, before the bind, and a record an
    earlier run left does not move them."""
    tmp_path, published, _ = project
    intercept(tmp_path)
    own = run_lib(tmp_path, 'load_service zlow && echo "$S_OWN_ADDRESS"').stdout.strip()
    (tmp_path / "out" / "state" / "run" / "loopback" / "zlow").write_text(f"bind TCP 0.0.0.0:80 {own}:24077\n")
    proc = run_lib(tmp_path, 'load_service zlow && echo "${S_FORWARDS[*]}" && clear_record && echo "${S_FORWARDS[*]}" '
                             '&& echo "${S_ENDPOINTS[*]}" && tracer_words && echo "${TRACER_WORDS[*]}"')
    assert proc.returncode == 0, proc.stderr
    before, after, endpoints, words = proc.stdout.splitlines()
    assert before == after == node_pairs(tmp_path, published + 2, f"{own}:24050")
    assert endpoints == f"{own}:24050?"  # (only published: it may never be opened)
    assert " --map 80:24050 " in f" {words} "
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    zlow = next(s for s in plan["services"] if s["name"] == "zlow")
    assert [(p["container"], p["traced_port"]) for p in zlow["ports"]] == [(80, 24050)]


def test_a_published_privileged_port_is_served_from_before_its_bind_to_after_it(project):
    """Forwarders start before the service binds (Docker publishes a port whether or not anything
    listens): a connection then is closed, not refused for good. The stand-in server then binds
    0.0.0.0:80 (planned: --map 80:24050) and 0.0.0.0:81 (unplanned: the block's next free port)
    under the real tracer with the words its entry gets, and the same forwarders serve it."""
    tmp_path, published, started = project
    intercept(tmp_path)
    own = run_lib(tmp_path, 'load_service zlow && echo "$S_OWN_ADDRESS"').stdout.strip()
    proc = run_lib(tmp_path, 'load_service zlow && service_running() { true; } && start_forwarders')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    started_forwarders = (tmp_path / "out" / "state" / "run" / "zlow.forward").read_text()
    with socket.create_connection(("127.0.0.1", published + 2), timeout=10) as early:
        early.settimeout(10)
        assert early.recv(1) == b""  # closed: nothing listens behind it yet
    words = run_lib(tmp_path, 'load_service zlow && tracer_words --block "$LOOPBACK_BLOCK" && '
                              'printf "%s\\n" "${TRACER_WORDS[@]}"').stdout.splitlines()
    record = tmp_path / "out" / "state" / "run" / "loopback" / "zlow"
    words = [str(tmp_path / "out" / "bin" / "x86_64" / "c2s-loopback")] + [
        str(record) if w == "/.c2s/records/zlow" else str(record.parent) if w == "/.c2s/records" else w
        for w in words[1:]]
    code = ("import http.server as h, threading; s = [h.HTTPServer(('0.0.0.0', p), h.SimpleHTTPRequestHandler) "
            "for p in (81, 80)]; threading.Thread(target=s[0].serve_forever).start(); s[1].serve_forever()")
    proc = subprocess.Popen(words + ["--", "python3", "-c", code, "c2s-standin-zlow"],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    started.append(proc)
    answers(published + 2)
    lines = run_lib(tmp_path, "isolation_mode; relocation_lines zlow").stdout.splitlines()
    assert sorted(lines) == [f"zlow: bind TCP 0.0.0.0:80 {own}:24050", f"zlow: bind TCP 0.0.0.0:81 {own}:24051"]
    assert (tmp_path / "out" / "state" / "run" / "zlow.forward").read_text() == started_forwarders
    run_lib(tmp_path, "stop_forwarders zlow")


def test_a_port_that_does_not_listen_in_time_is_late_not_failed_and_watched_until_it_listens(project):
    """wait_listening ends with 2 and the endpoints still silent (not 1, a failure), named by the
    port the service binds (80, not where the tracer puts it); once something listens there,
    watch_late says so in one line and forgets it, and `ps`'s not_listening_yet finds nothing."""
    tmp_path, _, _ = project
    intercept(tmp_path)
    own = run_lib(tmp_path, 'load_service zlow && echo "$S_OWN_ADDRESS"').stdout.strip()
    late = tmp_path / "out" / "state" / "run" / "zlow.late"
    script = ('load_service zlow && service_running() { true; } && out=$(wait_listening 1 published); rc=$?; '
              'echo "$rc|$out"; read -r -a e <<<"$out"; service_ports "${e[@]:1}"; echo "$SERVICE_PORTS"')
    proc = run_lib(tmp_path, script)
    rc_out, ports = proc.stdout.splitlines()
    rc, out = rc_out.split("|")
    assert (rc, out.split()[1:], ports) == ("2", [f"{own}:24050"], "80"), proc.stdout + proc.stderr
    late.write_text(f"0\n{own}:24050\n")
    proc = run_lib(tmp_path, 'load_service zlow && not_listening_yet && echo "${NOT_LISTENING[*]}" && watch_late')
    assert proc.stdout.strip() == f"{own}:24050" and late.exists() and "listening on" not in proc.stderr
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (an earlier test's connections may linger)
        listener.bind((own, 24050))
        listener.listen()
        proc = run_lib(tmp_path, 'load_service zlow && watch_late && not_listening_yet && echo "[${NOT_LISTENING[*]}]"')
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"zlow: listening on 80 now, \d+ s after its start", proc.stderr), proc.stderr
    assert proc.stdout.strip() == "[]" and not late.exists()


def test_a_service_that_ends_saying_nothing_shows_what_it_wrote_and_its_adapters_check(project):
    """squid writes why it stops into cache.log, not its output: explain_silent_exit shows the last
    lines of what the service wrote into its scratch directories at this start, then runs its
    adapter's check in its image (a STAND-IN RUNTIME here, `echo`, shows the command it got)."""
    tmp_path, _, _ = project
    sif = tmp_path / "out" / "sif" / "fake.sif"
    sif.parent.mkdir(exist_ok=True)
    sif.write_text("")
    script = ('load_service zlow && log_tail() { :; } && S_CHECK=(squid -k parse) && S_SIF=' + shlex.quote(str(sif)) +
              ' && : >"$RUNDIR/zlow.logs" && touch -d "-5 seconds" "$RUNDIR/zlow.logs" && abs "${S_EMPTY[0]}" && '
              'mkdir -p "$ABS" && echo "FATAL: Bungled /etc/squid/squid.conf line 2" >"$ABS/cache.log" && '
              'RT=echo && explain_silent_exit')
    proc = run_lib(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "run.sh: service zlow said nothing on its output"
    assert lines[1].startswith("--- last 10 lines of ") and lines[1].endswith("cache.log (written at this start) ---")
    assert lines[2] == "FATAL: Bungled /etc/squid/squid.conf line 2"
    assert lines[3] == "--- squid -k parse in its image ---"
    assert lines[4].startswith("exec ") and lines[4].endswith(f"{sif} squid -k parse")


def test_a_port_with_no_host_side_gets_a_free_port_of_the_node_kept_until_down(project):
    """`- "9000"`: as Docker, a free port of the node, the same on each of its addresses, chosen when
    the forwarders first start, kept while the project runs (load_service, ps) and told by `port`;
    the real forwarder relays it to a STAND-IN server on the service's own address."""
    tmp_path, _, started = project
    intercept(tmp_path)
    proc = run_lib(tmp_path, 'load_service zzeph && echo "$S_OWN_ADDRESS" && echo "${S_FORWARDS[*]}"')
    own, planned = proc.stdout.splitlines()
    assert planned == node_pairs(tmp_path, 0, f"{own}:24050") + " " + node_pairs(tmp_path, 0, f"{own}:9000")
    port = f"source {RUN}/cmd/port.sh && cmd_port zzeph 9000"
    proc = run_lib(tmp_path, port)
    assert proc.returncode != 0 and "a free port that `up` chooses" in proc.stderr, proc.stderr  # not started yet
    proc = run_lib(tmp_path, 'load_service zzeph && start_forwarders && cat "$RUNDIR/zzeph.published"')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = dict(line.split() for line in proc.stdout.splitlines())
    assert sorted(kept) == ["81", "9000"] and all(1024 <= int(p) < 65536 for p in kept.values())
    chosen = kept["9000"]
    # 81 is privileged: the tracer's place for it (--map 81:24050), published on the port kept for 81
    low = run_lib(tmp_path, 'load_service zzeph && echo "${S_FORWARDS[*]}"').stdout.split()
    assert f"127.0.0.1:{kept['81']}" in low and low[low.index(f"127.0.0.1:{kept['81']}") + 1] == f"{own}:24050"
    proc = run_lib(tmp_path, 'load_service zzeph && echo "${S_FORWARDS[*]}" && ' + port)
    forwards, told = proc.stdout.splitlines()
    assert forwards.endswith(node_pairs(tmp_path, int(chosen), f"{own}:9000")) and told == f"0.0.0.0:{chosen}"
    code = ("import http.server as h, sys; h.HTTPServer((sys.argv[1], 9000), h.SimpleHTTPRequestHandler)"
            ".serve_forever()")
    server = subprocess.Popen(["python3", "-c", code, own], start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=tmp_path)
    started.append(server)
    try:
        answers(int(chosen))
    finally:
        run_lib(tmp_path, "stop_forwarders zzeph")
