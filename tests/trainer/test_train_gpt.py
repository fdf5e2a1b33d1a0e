#!/usr/bin/env python3
"""Tests of examples/train_gpt run as a user runs it: under fsdpp-run, on a text file.

  test_train_gpt.py CASE --launcher fsdpp-run --trainer train_gpt --port P

Cases (each a ctest test TrainGpt.<Case>):
  ResumeAtSameWorldSizeIsBitwise  stop after step 6, --resume: the rest of the loss curve and
                                  the exported model.safetensors equal the uninterrupted run's
  ResumeAtAnotherWorldSize        stop at 4 ranks and resume at 2, stop at 2 and resume at 3:
                                  losses and weights within float32 tolerance of uninterrupted
  KilledSaveIsNeverResumed        rank 0 SIGKILLed while step 8's checkpoint is written: the
                                  job fails, --resume continues from step 4's, and the result
                                  equals the uninterrupted run bitwise
  ParallelismFlagsKeepTheRun      HSDP + activation checkpointing in bf16 stopped, resumed as plain
                                  FSDP on 2 ranks: the losses of plain FSDP on 4
  LearnsBelowUnigramEntropy       a short run's validation loss ends below the text's unigram
                                  entropy; model.safetensors is written, the sharded model samples
  FlagErrors                      misuse gets errors naming the flag; --help lists the flags
  GradAccumAndFineTuneFromHuggingFace
                                  --grad-accum 2 (last-micro-batch and every-micro-batch
                                  reduction) gives the losses of one batch; a transformers-made
                                  Llama directory with its BPE tokenizer fine-tuned 20 steps at 2
                                  ranks with --grad-accum 2, exported with --export-hf: transformers
                                  opens it, its loss fell, and at --lr 0 the export is the input
  MetricsAcrossResume             --metrics-file and --tensorboard through a stop and a resume: each
                                  logged step once, TensorBoard reads the same scalars; the loss
                                  curves' picture is written
  WithoutALauncher                train_gpt run directly trains as one rank; a broken rendezvous
                                  is one error line, never an abort
  ProgressBarOnATerminal          under fsdpp-run on a (pseudo-)terminal, rank 0 redraws a bar
                                  after every step as one status line, gone from the final screen
  ResumeErrorsNameTheWayOn        --resume on a folder without checkpoints says so; with rank 1's file
                                  of the newest checkpoint corrupt and a newer folder incomplete,
                                  --resume-from the corrupt one names the older one, and --resume
                                  skips both (one line each, all ranks together) and continues from
                                  the older one bitwise as the uninterrupted run
  MemoryLimitPerRank              --init deferred gives the losses of every world size alike; under
                                  --memory-limit the 4-rank run trains and the 1-rank run fails
                                  with an out-of-memory error naming the bytes
  PreemptedBySigtermResumesBitwise
                                  SIGTERM (through fsdpp-run) mid-run: exit code 75, the step
                                  reached saved, --resume ends bitwise as the uninterrupted run;
                                  the same for --exit-signal SIGUSR1; SIGUSR1 without the flag
                                  kills; without --ckpt-dir 75 and nothing saved
  RestartAfterAKilledRankIsBitwise
                                  rank 1 SIGKILLed mid-run under fsdpp-run --max-restarts 2: the
                                  restarted attempt resumes by itself and ends bitwise as the
                                  uninterrupted run
Only the standard library here: the file is read with the reader below (the format is 8 bytes of
header length, a JSON header, raw little-endian data), and once more with Python's safetensors,
which both legs have (CMake runs this with FSDPP_PYTHON: PyPI's or Debian 13's).
"""
import argparse
import array
import json
import os
import pty
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading

DEADLINE = 240  # seconds per trainer run (fsdpp-run's --timeout names a hung rank before)
# These cases are about CPU ranks (bitwise resumes, the CPU memory limit): on a host with a GPU the
# trainer's default would take it.
CPU = ["--device", "cpu"]


def synthetic_text(path, size=120_000, seed=7):
    """English-like text with structure a small model learns in a few hundred steps."""
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "my neighbour", "the old king", "a small bird", "the river", "our teacher"]
    verbs = ["sees", "follows", "remembers", "carries", "paints", "forgets", "answers"]
    objects = ["the moon", "a red apple", "the long road", "an open door", "the winter sky", "a quiet song"]
    endings = [".", ".", ".", "!", "?"]
    out = []
    while sum(len(s) for s in out) < size:
        s = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(endings)}"
        out.append(s[0].upper() + s[1:] + ("\n" if rng.random() < 0.2 else " "))
    with open(path, "w") as f:
        f.write("".join(out))


def read_safetensors(path):
    """name -> (dtype, shape, list of values) for F32 tensors; raw bytes for the others."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "F32":
            values = array.array("f")
            values.frombytes(raw)
            if sys.byteorder != "little":
                values.byteswap()
            tensors[name] = (info["dtype"], info["shape"], values)
        else:
            tensors[name] = (info["dtype"], info["shape"], raw)
    return tensors, header.get("__metadata__", {})


class Trainer:
    def __init__(self, args, workdir):
        self.args = args
        self.workdir = workdir
        self.corpus = os.path.join(workdir, "corpus.txt")
        synthetic_text(self.corpus)

    def command(self, nproc, *flags, data=True, launcher_flags=()):
        return [self.args.launcher, "--nproc-per-node", str(nproc), "--master-port", str(self.args.port),
                "--timeout", "120", *map(str, launcher_flags), self.args.trainer] + \
               (["--data", self.corpus] if data else []) + CPU + [str(f) for f in flags]

    def run(self, nproc, *flags, env=None, expect_ok=True, data=True):
        cmd = self.command(nproc, *flags, data=data)
        full_env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **(env or {}))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE, env=full_env)
        out = p.stdout + p.stderr
        if expect_ok and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{out}")
        if not expect_ok and p.returncode == 0:
            raise AssertionError(f"{' '.join(cmd)} should have failed:\n{out}")
        return out

    def run_and_act(self, nproc, *flags, when, act, launcher_flags=(), data=True):
        """Runs like run(), calling act(launcher process) once a line of the output (stdout and
        stderr together) matches the regex `when`; returns (exit code, output, whether it acted)."""
        cmd = self.command(nproc, *flags, data=data, launcher_flags=launcher_flags)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        watchdog = threading.Timer(DEADLINE, p.kill)
        watchdog.start()
        lines, acted = [], False
        try:
            for line in p.stdout:
                lines.append(line)
                if not acted and re.search(when, line):
                    act(p)
                    acted = True
            code = p.wait()
        finally:
            watchdog.cancel()
        return code, "".join(lines), acted

    def dir(self, name):
        return os.path.join(self.workdir, name)


def rank_pids(launcher):
    """rank -> pid of the launcher's rank processes (its children, each with RANK in its environment)."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            if parent != launcher.pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if b"RANK" in env:
            pids[int(env[b"RANK"])] = int(entry)
    return pids


def signal_ranks(launcher, sig):
    pids = rank_pids(launcher)
    check(len(pids) > 0, "found no rank processes to signal")
    for pid in pids.values():
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# A tiny model: 2 blocks, width 32; 12 steps, a checkpoint every 4, a loss line every step.
MODEL = ["--layers", 2, "--dim", 32, "--heads", 2, "--seq", 32, "--batch", 12, "--steps", 12,
         "--warmup", 3, "--lr", 3e-3, "--log-every", 1, "--eval-every", 6, "--eval-batches", 2,
         "--ckpt-every", 4, "--sample-tokens", 40]
# What a resumed run is given besides --ckpt-dir --resume: this run's flags only (the run's
# shape, data, batch and schedule come from the checkpoint).
RESUME = ["--resume", "--log-every", 1, "--eval-every", 6, "--eval-batches", 2, "--sample-tokens", 40]


def losses(output):
    """step -> training loss (as printed, 6 decimals) and validation losses."""
    train = {int(m[0]): m[1] for m in re.findall(r"step +(\d+)/\d+ \| loss ([0-9.]+)", output)}
    val = {int(m[0]): m[1] for m in re.findall(r"step +(\d+)/\d+ \| validation loss ([0-9.]+)", output)}
    return train, val


def check(cond, message, output=""):
    if not cond:
        raise AssertionError(message + ("\n--- output ---\n" + output if output else ""))


def uninterrupted(t, nproc, name):
    out = t.run(nproc, *MODEL, "--ckpt-dir", t.dir(name))
    return out, os.path.join(t.dir(name), "model.safetensors")


def same_file(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def case_resume_same(t):
    ref_out, ref_model = uninterrupted(t, 2, "straight")
    first = t.run(2, *MODEL, "--ckpt-dir", t.dir("stopped"), "--stop-after", 6)
    check("stopped after step 6 of 12" in first, "--stop-after 6 did not stop at 6", first)
    # Resume with no model flags at all: they come from the checkpoint.
    second = t.run(2, "--ckpt-dir", t.dir("stopped"), *RESUME)
    check("resumed from " + os.path.join(t.dir("stopped"), "step-00000006") in second, "did not resume from step 6", second)
    ref_train, ref_val = losses(ref_out)
    a_train, a_val = losses(first)
    b_train, b_val = losses(second)
    check(sorted(b_train) == list(range(7, 13)), f"resumed run logged steps {sorted(b_train)}", second)
    for step in range(1, 13):
        got = a_train.get(step) if step <= 6 else b_train.get(step)
        check(got == ref_train[step], f"step {step}: loss {got} vs uninterrupted {ref_train[step]}", first + second)
    check(b_val[12] == ref_val[12], f"final validation loss {b_val[12]} vs {ref_val[12]}")
    resumed_model = os.path.join(t.dir("stopped"), "model.safetensors")
    check(same_file(resumed_model, ref_model), "the resumed run's model.safetensors differs from the uninterrupted one's")
    # Python's safetensors opens the exported file.
    probe = subprocess.run([sys.executable, "-c", "import safetensors.numpy"], capture_output=True)
    check(probe.returncode == 0, f"{sys.executable} has no safetensors (scripts/install-deps.sh installs it): "
          f"{probe.stderr.decode(errors='replace').strip()}")
    if probe.returncode == 0:
        script = ("import sys, safetensors.numpy as s; t = s.load_file(sys.argv[1]); "
                  "print(len(t), sum(v.size for v in t.values()))")
        out = subprocess.run([sys.executable, "-c", script, ref_model], capture_output=True, text=True)
        tensors, _ = read_safetensors(ref_model)
        expected = f"{len(tensors)} {sum(len(v[2]) if v[0] == 'F32' else 0 for v in tensors.values())}"
        check(out.returncode == 0 and out.stdout.split() == expected.split(),
              f"Python's safetensors read {out.stdout!r} (expected {expected}): {out.stderr}")
        print("Python's safetensors opened model.safetensors:", out.stdout.strip())
    print("ok: steps 7-12 after --resume equal the uninterrupted run bitwise, and so does model.safetensors")


def max_difference(a_path, b_path):
    a, _ = read_safetensors(a_path)
    b, _ = read_safetensors(b_path)
    check(sorted(a) == sorted(b), f"tensor names differ: {sorted(a)} vs {sorted(b)}")
    worst = 0.0
    for name in a:
        check(a[name][1] == b[name][1], f"{name}: shape {a[name][1]} vs {b[name][1]}")
        for x, y in zip(a[name][2], b[name][2]):
            worst = max(worst, abs(x - y) / (1e-3 + abs(y)))
    return worst


def case_resume_other(t):
    # float32 sums in another order at another world size. Measured: losses equal to the 6
    # printed decimals, weights within 4.5e-4 (relative, 1e-3 floor; 6.6e-7 absolute), the
    # largest in lm_head's rows of bytes the text never has: their gradients are rounding-sized,
    # and Adam divides each by its own scale. Checked with a margin of ~3x.
    for n_from, n_to in [(4, 2), (2, 3)]:
        ref_out, ref_model = uninterrupted(t, n_to, f"straight-{n_to}")
        t.run(n_from, *MODEL, "--ckpt-dir", t.dir(f"run-{n_from}-{n_to}"), "--stop-after", 6)
        out = t.run(n_to, "--ckpt-dir", t.dir(f"run-{n_from}-{n_to}"), *RESUME)
        check(f"now on {n_to} ranks" in out, f"did not resume on {n_to} ranks", out)
        ref_train, _ = losses(ref_out)
        got_train, _ = losses(out)
        worst_loss = max(abs(float(got_train[s]) - float(ref_train[s])) / float(ref_train[s]) for s in range(7, 13))
        worst_weight = max_difference(os.path.join(t.dir(f"run-{n_from}-{n_to}"), "model.safetensors"), ref_model)
        print(f"{n_from} -> {n_to} ranks: losses of steps 7-12 within {worst_loss:.2e} relative, "
              f"weights within {worst_weight:.2e} (relative, 1e-3 floor) of an uninterrupted {n_to}-rank run")
        check(worst_loss <= 2e-6, f"{n_from} -> {n_to}: losses differ by {worst_loss:.3g} relative", out)
        check(worst_weight <= 1.5e-3, f"{n_from} -> {n_to}: weights differ by {worst_weight:.3g}", out)
    print("ok")


def case_killed_save(t):
    _, ref_model = uninterrupted(t, 2, "straight")
    out = t.run(2, *MODEL, "--ckpt-dir", t.dir("killed"), env={"FSDPP_TRAIN_GPT_KILL_IN_SAVE": "8"}, expect_ok=False)
    names = sorted(os.listdir(t.dir("killed")))
    check("step-00000004" in names, f"step 4's checkpoint is missing: {names}", out)
    check(not os.path.exists(os.path.join(t.dir("killed"), "step-00000008", "metadata.json")),
          f"the checkpoint killed mid-save looks complete: {names}", out)
    resumed = t.run(2, "--ckpt-dir", t.dir("killed"), *RESUME)
    check("resumed from " + os.path.join(t.dir("killed"), "step-00000004") in resumed,
          "did not resume from step 4's checkpoint", resumed)
    left = sorted(os.listdir(t.dir("killed")))
    check(not any(".tmp-" in n for n in left), f"the killed save's staging folder was not cleaned up: {left}")
    check(same_file(os.path.join(t.dir("killed"), "model.safetensors"), ref_model),
          "after resuming from step 4 the model differs from the uninterrupted run's")
    print(f"ok: killed during step 8's save ({names}); resumed from step 4; final model equal bitwise")


def case_learns(t):
    out = t.run(2, "--layers", 2, "--dim", 64, "--heads", 4, "--seq", 64, "--batch", 16, "--steps", 150,
                "--warmup", 10, "--lr", 3e-3, "--log-every", 50, "--eval-every", 75, "--eval-batches", 4,
                "--out", t.dir("model.safetensors"), "--sample-tokens", 80, "--prompt", "The ")
    m = re.search(r"validation loss ([0-9.]+) nats/token vs the corpus' unigram entropy ([0-9.]+)", out)
    check(m is not None, "no summary line", out)
    val, entropy = float(m[1]), float(m[2])
    check(val < 0.6 * entropy, f"validation loss {val} is not clearly below the unigram entropy {entropy}", out)
    check("sample (generated by the sharded model on every rank)" in out and os.path.exists(t.dir("model.safetensors")), "no sample or model file", out)
    print(out)
    print(f"ok: validation loss {val} < 0.6 x unigram entropy {entropy}")


def case_parallelism_flags(t):
    # bf16 compute; HSDP 2 x 2 with every block checkpointed, stopped at step 6 and resumed as
    # plain FSDP on 2 ranks (parallelism is not part of the run), against plain FSDP on 4 ranks.
    bf16 = MODEL + ["--param-dtype", "bfloat16"]
    ref, _ = losses(t.run(4, *bf16, "--ckpt-dir", t.dir("plain")))
    first = t.run(4, *bf16, "--ckpt-dir", t.dir("hsdp"), "--replicate", 2, "--activation-checkpointing",
                  "--stop-after", 6)
    check("HSDP 2 x 2, bf16 compute, activation checkpointing" in first, "the flags did not take effect", first)
    second = t.run(2, "--ckpt-dir", t.dir("hsdp"), *RESUME)
    check("now on 2 ranks" in second and "HSDP" not in second, "did not resume as plain FSDP on 2 ranks", second)
    got = {**losses(first)[0], **losses(second)[0]}
    check(sorted(got) == list(range(1, 13)), f"steps logged: {sorted(got)}", first + second)
    worst = max(abs(float(got[s]) - float(ref[s])) / float(ref[s]) for s in range(1, 13))
    print(f"HSDP + activation checkpointing (steps 1-6, 4 ranks) then plain FSDP (7-12, 2 ranks), bf16: "
          f"losses within {worst:.2e} relative of plain FSDP on 4 ranks")
    check(worst <= 4e-3, f"losses differ by {worst:.3g} relative (bf16's half-ulp is 3.9e-3)", first + second)
    print("ok")


def case_flag_errors(t):
    out = t.run(2, *MODEL[:-2], "--batch", 5, expect_ok=False)
    check("--batch 5 is not a multiple of the world size 2" in out, "no error naming --batch", out)
    out = t.run(1, "--layers", 0, expect_ok=False)
    check("--layers must be positive, not 0" in out, "no error naming --layers", out)
    out = t.run(1, "--lr", "fast", expect_ok=False)
    check("--lr fast: not a number" in out, "no error naming --lr", out)
    out = t.run(1, "--device", "gpu", expect_ok=False)
    check("--device gpu: expected cuda, cpu or auto" in out, "no error naming --device", out)
    out = t.run(1, "--lr-schedule", "step", expect_ok=False)
    check("--lr-schedule step: expected cosine, linear or constant" in out, "no error naming --lr-schedule", out)
    out = t.run(1, "--config", t.dir("config.json"), "--layers", 2, expect_ok=False)
    check("--layers with --config: the model's shape comes from its config.json" in out, "no error naming --layers", out)
    out = t.run(1, "--config", t.dir("absent.json"), expect_ok=False)
    check(t.dir("absent.json") in out and "Traceback" not in out, "no error naming the config file", out)
    out = t.run(1, "--tokenizer", t.dir("no-tokenizer"), expect_ok=False)
    check(t.dir("no-tokenizer") in out, "no error naming the tokenizer path", out)
    os.makedirs(t.dir("weights-only"))
    out = t.run(1, "--init-from", t.dir("weights-only"), expect_ok=False)
    check("has no tokenizer.json or tokenizer.model: give --tokenizer" in out, "no error about --init-from's tokenizer", out)
    # --help lists every flag with its default, one line each (a long default once broke it).
    helped = subprocess.run([t.args.trainer, "--help"], capture_output=True, text=True, timeout=60)
    check(helped.returncode == 0, "--help failed", helped.stdout + helped.stderr)
    for flag in ("--val-fraction (0.1)", "--device (auto)", "--peak-tflops (0)", "--memory-limit (0)"):
        check(flag in helped.stdout, "--help does not show " + flag, helped.stdout)
    t.run(2, *MODEL, "--ckpt-dir", t.dir("run"), "--stop-after", 4)
    out = t.run(2, "--ckpt-dir", t.dir("run"), "--resume", "--dim", 64, expect_ok=False)
    check("--dim 64 differs from 32 in " + os.path.join(t.dir("run"), "step-00000004") in out,
          "no error naming --dim and the checkpoint", out)
    print("ok")


def run_on_terminal(cmd, env):
    """Runs cmd with its stdout on a pseudo-terminal; returns (exit code, bytes shown, stderr)."""
    master, slave = pty.openpty()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=slave, stderr=err, env=env)
        os.close(slave)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            shown += chunk
        os.close(master)
        code = p.wait(timeout=DEADLINE)
        err.seek(0)
        return code, shown.decode(), err.read().decode()


def screen(shown):
    """The lines a terminal shows after `shown` (carriage return, erase to end of line, newline)."""
    lines, column = [""], 0
    i = 0
    while i < len(shown):
        if shown.startswith("\033[K", i):
            lines[-1] = lines[-1][:column]
            i += 3
            continue
        ch = shown[i]
        if ch == "\r":
            column = 0
        elif ch == "\n":
            lines.append("")
            column = 0
        else:
            line = lines[-1]
            lines[-1] = line[:column] + ch + line[column + 1:]
            column += 1
        i += 1
    return lines


def case_progress_bar(t):
    cmd = [t.args.launcher, "--nproc-per-node", "2", "--master-port", str(t.args.port), "--timeout", "120",
           t.args.trainer, "--data", t.corpus, "--ckpt-dir", t.dir("bar")] + CPU + [str(f) for f in MODEL] + ["--log-every", "4"]
    code, shown, err = run_on_terminal(cmd, dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    check(code == 0, f"exited {code}: {err}", shown)
    bars = re.findall(r"\r\033\[K\[rank0\]: \[[#.]+\] step +(\d+)/12", shown)
    # A step followed at once by its log line may never be drawn (both reach fsdpp-run in one read):
    # of 12 steps, 8 have no line after them (log every 4, validation at 6).
    steps = [int(b) for b in bars]
    check(len(steps) >= 6 and steps == sorted(steps), f"the bar was drawn at steps {steps}", repr(shown))
    lines = screen(shown)
    check(not any(re.search(r"\[[#.]{10,}\] step", line) for line in lines), "a bar is left on the screen",
          "\n".join(lines))
    check(any(re.search(r"step +12/12 \| loss", line) for line in lines),
          "no progress line for step 12 on the screen", "\n".join(lines))
    print(f"ok: the bar was redrawn {len(bars)} times (steps {bars[0]}..{bars[-1]}); the final screen:")
    print("\n".join(lines))


def flip_a_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))


def case_resume_errors(t):
    os.makedirs(t.dir("empty"))
    out = t.run(2, "--ckpt-dir", t.dir("empty"), "--resume", data=False, expect_ok=False)
    check(t.dir("empty") + " holds no complete checkpoint to continue from" in out, "no error saying so", out)
    check("--data" not in out.split("to continue from")[0], "the error is about --data", out)
    ref_out, ref_model = uninterrupted(t, 2, "reference")
    t.run(2, *MODEL, "--ckpt-dir", t.dir("run"), "--stop-after", 8)
    newest = os.path.join(t.dir("run"), "step-00000008")
    older = os.path.join(t.dir("run"), "step-00000004")
    # One flipped byte in rank 1's data file only: rank 0 reads its part of step 8 fine, rank 1
    # cannot, and both must move on together. Newer still, a folder without metadata.json.
    flip_a_byte(os.path.join(newest, "rank-00001.safetensors"))
    incomplete = os.path.join(t.dir("run"), "step-00000010")
    os.makedirs(incomplete)
    # --resume-from stays strict: the error names the newest older checkpoint and the flag.
    out = t.run(2, "--ckpt-dir", t.dir("run"), *RESUME[1:], "--resume-from", newest, data=False, expect_ok=False)
    check("cannot resume from " + newest in out, "the error does not name the corrupt checkpoint", out)
    check("continue from it with --resume-from " + older in out, "the error does not name the older one", out)
    out = t.run(2, "--ckpt-dir", t.dir("run"), *RESUME)
    skipped = [line for line in out.splitlines() if "skipping " in line]
    check(len(skipped) == 2 and skipped[0].endswith("skipping " + incomplete + ": incomplete: no metadata.json")
          and ("skipping " + newest + ": rank 1: ") in skipped[1] and "checksum mismatch" in skipped[1],
          f"expected one line for each of the 2 skipped, step 8's naming rank 1's checksum: {skipped}", out)
    check("resumed from " + older + " (step 4)" in out, "did not resume from step 4", out)
    ref_train, _ = losses(ref_out)
    got_train, _ = losses(out)
    check(all(got_train[s] == ref_train[s] for s in range(5, 13)), "steps 5-12 differ from the uninterrupted run", out)
    check(same_file(os.path.join(t.dir("run"), "model.safetensors"), ref_model),
          "model.safetensors differs from the uninterrupted run's", out)
    print("\n".join(skipped))
    print("ok: empty folder named; --resume-from the corrupt step 8 names step 4; --resume skips the incomplete "
          "step 10 and step 8 (one line each), continues from step 4 and equals the uninterrupted run bitwise")


# The preemption and restart cases run 24 steps, so the run is still training when the signal
# or the kill, sent once step 5 or 7 is printed, arrives (a step takes ~15 ms here).
LONG = MODEL + ["--steps", 24]
PREEMPTED = re.compile(r"preempted by (SIG\w+) after step (\d+): saved (\S+); resume with --resume")


def launcher_has(t, flag):
    helped = subprocess.run([t.args.launcher, "--help"], capture_output=True, text=True, timeout=60)
    return flag in helped.stdout


def case_preempted(t):
    t.run(2, *LONG, "--ckpt-dir", t.dir("straight"))
    ref_model = os.path.join(t.dir("straight"), "model.safetensors")
    # fsdpp-run forwards its SIGTERM to the ranks with a grace (--signal-grace-seconds) and exits
    # 75 when they all do.
    check(launcher_has(t, "--signal-grace-seconds"), f"{t.args.launcher} has no --signal-grace-seconds")
    sigterm = lambda p: p.send_signal(signal.SIGTERM)
    usr1 = lambda p: signal_ranks(p, signal.SIGUSR1)
    at_step_5 = r"step +5/24 \| loss"
    for name, send, extra in [("SIGTERM", sigterm, []), ("SIGUSR1", usr1, ["--exit-signal", "SIGUSR1"])]:
        run_dir = t.dir("preempted-" + name)
        code, out, acted = t.run_and_act(2, *LONG, "--ckpt-dir", run_dir, *extra, when=at_step_5, act=send)
        check(acted and code == 75, f"{name}: exit code {code}, not 75 (preempted)", out)
        m = PREEMPTED.search(out)
        check(m is not None and m[1] == name, f"no line 'preempted by {name} after step N: saved ...'", out)
        step = int(m[2])
        check(5 <= step < 24 and m[3] == os.path.join(run_dir, f"step-{step:08d}") and
              os.path.exists(os.path.join(m[3], "metadata.json")), f"step {step}'s checkpoint is not complete", out)
        check(f"step {step + 1:6d}/24" not in out, f"trained past step {step}", out)
        resumed = t.run(2, "--ckpt-dir", run_dir, *RESUME)
        check(f"resumed from {m[3]} (step {step})" in resumed, f"did not resume from step {step}", resumed)
        check(same_file(os.path.join(run_dir, "model.safetensors"), ref_model),
              f"after {name} at step {step} and --resume, model.safetensors differs from the uninterrupted run's")
        periodic = "a periodic step: its save was waited for" if step % 4 == 0 else f"the last periodic save was step {step // 4 * 4}"
        print(f"{name} ({'via fsdpp-run' if name == 'SIGTERM' else 'to the ranks'}) at step 5: "
              f"saved step {step} ({periodic}), exit 75; --resume equals the uninterrupted run bitwise")
    # Without --exit-signal, SIGUSR1 keeps its default action (the ranks die at once).
    killed, out, acted = t.run_and_act(2, *LONG, "--ckpt-dir", t.dir("usr1-default"), when=at_step_5, act=usr1)
    check(acted and killed not in (0, 75) and "preempted by" not in out, f"SIGUSR1 without --exit-signal: exit {killed}",
          out)
    # Without --ckpt-dir: preempted all the same, and it says nothing was saved.
    code, out, acted = t.run_and_act(2, *LONG, when=at_step_5, act=sigterm)
    check(acted and code == 75 and "nothing saved (no --ckpt-dir)" in out, f"without --ckpt-dir: exit {code}", out)
    print("ok: SIGTERM and --exit-signal SIGUSR1 save the step reached and exit 75; --resume continues bitwise; "
          f"SIGUSR1 without the flag ends the job (exit {killed}); without --ckpt-dir 75, nothing saved")


def case_restart(t):
    check(launcher_has(t, "--max-restarts"), f"{t.args.launcher} has no --max-restarts (rebuild fsdpp-run)")
    t.run(2, *LONG, "--ckpt-dir", t.dir("straight"))
    ref_model = os.path.join(t.dir("straight"), "model.safetensors")
    run_dir = t.dir("restarted")
    killed = []

    def kill_rank_1(p):
        pid = rank_pids(p).get(1)
        check(pid is not None, "rank 1's process not found")
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    code, out, acted = t.run_and_act(2, *LONG, "--ckpt-dir", run_dir, "--ckpt-every", 2, when=r"step +7/24 \| loss",
                                     act=kill_rank_1, launcher_flags=["--max-restarts", 2])
    check(acted and killed, "rank 1 was not killed", out)
    check(code == 0, f"exit code {code} after a restart", out)
    check("restarting all ranks" in out, "fsdpp-run does not say it restarted the ranks", out)
    m = re.search(r"resumed from (\S+) \(step (\d+)\)", out)
    check("restart 1 of the job" in out and m is not None and int(m[2]) >= 6, "the restart did not resume", out)
    check(same_file(os.path.join(run_dir, "model.safetensors"), ref_model),
          "after the restart model.safetensors differs from the uninterrupted run's", out)
    print(f"ok: rank 1 SIGKILLed after step 7; fsdpp-run --max-restarts 2 restarted the job, which resumed from "
          f"step {m[2]} and ended bitwise equal to the uninterrupted run")


def case_memory_limit(t):
    # The same initial weights at every world size (deferred init is seeded per module): step 1's
    # loss, before any update, agrees up to the order of the ranks' sums.
    one = losses(t.run(1, *MODEL))[0]
    four = losses(t.run(4, *MODEL))[0]
    check(abs(float(one[1]) - float(four[1])) <= 2e-6 * float(one[1]), f"step 1's loss at 1 rank {one[1]} vs 4 ranks {four[1]}")
    # Peak tensor memory of this model in training (measured): 4.1 MB at 1 rank, 1.05 MB at 4.
    limit = ["--memory-limit", 2_000_000]
    # The end of the run (the export and the sample, generated by the sharded model) stays
    # within the limit too.
    out = t.run(4, *MODEL, *limit, "--out", t.dir("limited.safetensors"))
    check(losses(out)[0] == four, "the 4-rank run under the limit trained differently", out)
    check(os.path.exists(t.dir("limited.safetensors")) and "sample (generated" in out, "no export or sample", out)
    m = re.search(r"training ([0-9.]+) MiB, end of run \(exports, sample\) ([0-9.]+) MiB", out)
    check(m is not None, "the summary does not report the training and end-of-run peaks apart", out)
    print(f"4 ranks under the limit: training peak {m[1]} MiB, end of run {m[2]} MiB")
    out = t.run(1, *MODEL, *limit, expect_ok=False)
    check("out of memory under fsdpp's memory limit" in out and "a limit of 2000000 bytes" in out,
          "the 1-rank run did not fail with an out-of-memory error naming the limit", out)
    check("peak tensor memory" in out and "Traceback" not in out, "no clean report", out)
    print("ok: under a 2 MB limit 4 ranks train (losses as without it) and 1 rank stops with an out-of-memory error")


def python_has(*modules):
    """Whether this interpreter imports `modules` (the primary leg's venv has transformers,
    tokenizers and tensorboard; Debian's 2.6 leg has none of them)."""
    code = "import " + ", ".join(modules)
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def helper(*args):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_fine_tune.py")
    p = subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True, timeout=DEADLINE)
    if p.returncode != 0:
        raise AssertionError(f"hf_fine_tune.py {args[0]} failed:\n{p.stdout}{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def case_grad_accum_and_fine_tune(t):
    # Gradient accumulation: the global batch of 12 at 2 ranks as 2 micro-batches of 3 per rank.
    # The bytes each rank sends per step show the micro-batches: each gathers the layers again,
    # and --reduce-every-micro-batch reduce-scatters each one's gradients too.
    def sent(out):
        return max(float(x) for x in re.findall(r"sent ([0-9.]+) MiB/step", out))
    out = t.run(2, *MODEL)
    one, bytes_one = losses(out)[0], sent(out)
    bytes_two = {}
    for extra in ([], ["--reduce-every-micro-batch"]):
        out = t.run(2, *MODEL, "--grad-accum", 2, *extra)
        two, bytes_two[bool(extra)] = losses(out)[0], sent(out)
        worst = max(abs(float(two[s]) - float(one[s])) / float(one[s]) for s in one)
        print(f"--grad-accum 2 {' '.join(extra)}: losses within {worst:.2e} relative of one batch; "
              f"{bytes_two[bool(extra)]:.3f} MiB sent per step (one batch: {bytes_one:.3f})")
        check(sorted(two) == sorted(one) and worst <= 2e-5, f"--grad-accum 2 {extra} differs by {worst:.3g}")
    check(bytes_one < bytes_two[False] < bytes_two[True],
          f"bytes per step do not show the micro-batches: {bytes_one}, {bytes_two}")
    out = t.run(2, *MODEL, "--grad-accum", 4, expect_ok=False)
    check("--batch 12 is not a multiple of the world size 2 x --grad-accum 4" in out, "no error naming --grad-accum", out)
    if not python_has("transformers", "tokenizers"):
        print("skipped the fine-tuning part: this Python has no transformers/tokenizers (Debian's leg)")
        return
    init = t.dir("hf-init")
    vocab = helper("make", t.corpus, init)["vocab"]
    tune = ["--init-from", init, "--seq", 32, "--batch", 8, "--grad-accum", 2, "--steps", 20, "--warmup", 2,
            "--lr", 3e-3, "--log-every", 5, "--eval-every", 10, "--eval-batches", 2, "--sample-tokens", 12,
            "--prompt", "The "]
    out = t.run(2, *tune, "--export-hf", t.dir("hf-tuned"))
    check(f"vocab {vocab}, from {init}" in out and f"({init};" in out, "did not take the directory's model and tokenizer", out)
    got = helper("check", init, t.dir("hf-tuned"), t.corpus)
    print(out)
    print("transformers on the export:", json.dumps(got))
    check(got["changed"] == got["tensors"], f"only {got['changed']} of {got['tensors']} tensors changed", out)
    check(got["loss_after"] < got["loss_before"] - 0.3, f"the loss did not fall: {got}", out)
    # --lr 0 (and so no weight decay): the export is the directory's weights, bitwise.
    t.run(2, *tune, "--lr", 0, "--min-lr", 0, "--export-hf", t.dir("hf-same"), "--sample-tokens", 0)
    same = helper("check", init, t.dir("hf-same"), t.corpus)
    check(same["changed"] == 0, f"at --lr 0 {same['changed']} tensors changed in the round trip", json.dumps(same))
    print("ok: --grad-accum equals one batch; fine-tuned export opened by transformers, loss "
          f"{got['loss_before']:.3f} -> {got['loss_after']:.3f}; --lr 0 round trip bitwise")


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def case_metrics_across_resume(t):
    flags = ["--ckpt-dir", t.dir("run"), "--metrics-file", t.dir("metrics.jsonl"), "--tensorboard", t.dir("tb")]
    t.run(2, *MODEL, *flags, "--stop-after", 8, "--lr-schedule", "linear", "--min-lr", 1e-4)
    # Steps 7 and 8 are logged again by the resumed run (it continues from step 4's checkpoint
    # after the one of step 8 is removed, as if the job had died after saving step 4).
    import shutil
    shutil.rmtree(os.path.join(t.dir("run"), "step-00000008"))
    out = t.run(2, *RESUME, *flags, data=False)
    check("resumed from " + os.path.join(t.dir("run"), "step-00000004") in out, "did not resume from step 4", out)
    records = read_metrics(t.dir("metrics.jsonl"))
    steps = [r["step"] for r in records]
    check(steps == list(range(1, 13)), f"metrics steps {steps}", out)
    train, val = losses(out)
    for r in records:
        for key in ("loss", "lr", "tokens_per_s", "grad_norm", "peak_memory_bytes", "bytes_sent_per_step"):
            check(key in r, f"step {r['step']} lacks {key}: {r}")
        if r["step"] in train:
            check(f"{r['loss']:.6f}" == train[r["step"]], f"step {r['step']}: {r['loss']} vs the line's {train[r['step']]}")
    check([r["step"] for r in records if "val_loss" in r] == [6, 12], "validation losses not at steps 6 and 12")
    # The schedule (recorded in the checkpoint, so the resumed run keeps it): linear warm-up over
    # 3 steps to 3e-3, then a line to 1e-4 at step 12; each record's lr is its step's.
    def linear(i):
        return 3e-3 * (i + 1) / 3 if i < 3 else 3e-3 + (1e-4 - 3e-3) * (i - 3) / 9
    for r in records:
        check(abs(r["lr"] - linear(r["step"] - 1)) <= 1e-12, f"step {r['step']}: lr {r['lr']} vs {linear(r['step'] - 1)}")
    check(os.path.getsize(os.path.join(t.dir("run"), "loss-curve.svg")) > 500, "no loss-curve picture", out)
    if not python_has("tensorboard"):
        print("skipped the TensorBoard part: this Python has no tensorboard (Debian's leg)")
        return
    code = ("import json,sys\nfrom tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
            "a=EventAccumulator(sys.argv[1]); a.Reload()\n"
            "print(json.dumps({t: [[e.step, e.value] for e in a.Scalars(t)] for t in a.Tags()['scalars']}))")
    p = subprocess.run([sys.executable, "-c", code, t.dir("tb")], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "TensorBoard could not read the events", p.stdout + p.stderr)
    scalars = json.loads(p.stdout)
    tb_loss = scalars.get("train/loss", [])
    check([s for s, _ in tb_loss] == list(range(1, 13)), f"TensorBoard's train/loss steps {[s for s, _ in tb_loss]}")
    for (step, value), r in zip(tb_loss, records):
        check(abs(value - r["loss"]) <= 1e-6 * r["loss"], f"step {step}: TensorBoard {value} vs {r['loss']}")
    check([s for s, _ in scalars.get("validation/loss", [])] == [6, 12], "TensorBoard's validation/loss steps")
    print(f"ok: steps 1-12 once each in the metrics file and in TensorBoard ({len(scalars)} scalar tags)")


def case_without_launcher(t):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OPENBLAS_NUM_THREADS"] = "1"
    cmd = [t.args.trainer, "--data", t.corpus, *CPU, *[str(f) for f in MODEL], "--steps", 4, "--out", t.dir("m.safetensors")]
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=DEADLINE, env=env)
    out = p.stdout + p.stderr
    check(p.returncode == 0 and "running as one rank" in out and "1 ranks on the CPU" in out, "did not run as one rank", out)
    alone = losses(out)[0]
    launched = losses(t.run(1, *MODEL, "--steps", 4))[0]
    check(alone == launched, f"alone {alone} vs under fsdpp-run at 1 rank {launched}", out)
    # A rendezvous that cannot happen: one line naming what is missing, no abort.
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=DEADLINE,
                       env=dict(env, RANK="0", WORLD_SIZE="2"))
    out = p.stdout + p.stderr
    check(p.returncode == 1 and "MASTER_ADDR" in out and "terminate called" not in out, "no clean rendezvous error", out)
    print("ok: without a launcher train_gpt trains as one rank (the losses of fsdpp-run's 1 rank); a broken rendezvous "
          "is one line:", out.strip().splitlines()[-1])


CASES = {
    "ResumeAtSameWorldSizeIsBitwise": case_resume_same,
    "ResumeAtAnotherWorldSize": case_resume_other,
    "KilledSaveIsNeverResumed": case_killed_save,
    "LearnsBelowUnigramEntropy": case_learns,
    "ParallelismFlagsKeepTheRun": case_parallelism_flags,
    "FlagErrors": case_flag_errors,
    "GradAccumAndFineTuneFromHuggingFace": case_grad_accum_and_fine_tune,
    "MetricsAcrossResume": case_metrics_across_resume,
    "WithoutALauncher": case_without_launcher,
    "ProgressBarOnATerminal": case_progress_bar,
    "ResumeErrorsNameTheWayOn": case_resume_errors,
    "MemoryLimitPerRank": case_memory_limit,
    "PreemptedBySigtermResumesBitwise": case_preempted,
    "RestartAfterAKilledRankIsBitwise": case_restart,
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--launcher", required=True)
    p.add_argument("--trainer", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="train_gpt_test.") as workdir:
        CASES[args.case](Trainer(args, workdir))


if __name__ == "__main__":
    main()
