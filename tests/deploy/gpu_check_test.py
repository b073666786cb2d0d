"""deploy/gpu_check.sh and deploy/gpu_report.py, dry-run on a CPU machine
(ctest GpuCheck.script).

The check itself runs real programs: real ctest over a small CMake project
whose tests pass, skip, fail, crash and hang, built by real CMake (its
targets carry the names of the GPU test programs, so the check's build step
builds them). What is checked: the parts, their steps and timeouts; a step cut
at its timeout, and the rest going on; steps that the budget cannot fit
skipped; results copied out after every step, so that a command killed with
SIGKILL still leaves what finished; the report naming failed, timed-out and
crashed tests; reports merged from several machines; the reference scripts
(tests/reference/hf_gpu_logits_check.py, bench/gpu_model_bench.py)
importing and reaching their skip without a GPU, with the keywords of
transformers 4 and 5.

    gpu_check_test.py SOURCE_DIR WORK_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

SRC = WORK = None
PY = "/usr/bin/python3"  # Debian's, which has torch (deploy/install_deps.sh)

FAKE_PROJECT = r"""
cmake_minimum_required(VERSION 3.16)
project(gpu_check_fake NONE)
enable_testing()
# The GPU test programs the check's part "tests" builds; building
# policy_logits waits BUILD_SLEEP seconds (from the environment).
foreach(t rollout_server_gpu_tests learner_server_gpu_tests nccl_gpu_tests
    data_parallel_rank)
  add_custom_target(${t} COMMAND true)
endforeach()
add_custom_target(policy_logits COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/build.sh)
add_test(NAME Gpu.Passes COMMAND true)
add_test(NAME Gpu.Skips COMMAND sh -c "exit 77")
add_test(NAME Gpu.Fails COMMAND false)
add_test(NAME Gpu.Crashes COMMAND sh -c "kill -SEGV $$")
add_test(NAME Gpu.Hangs COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/hang.sh)
set_tests_properties(Gpu.Passes Gpu.Skips Gpu.Fails Gpu.Crashes Gpu.Hangs PROPERTIES LABELS gpu)
set_tests_properties(Gpu.Skips PROPERTIES SKIP_RETURN_CODE 77)
set_tests_properties(Gpu.Hangs PROPERTIES TIMEOUT $ENV{HANG_TIMEOUT})
add_test(NAME Cpu.NotAGpuTest COMMAND false)
"""


def fake_tree(name, hang_timeout=1):
    """A configured build tree of the fake project; returns (build, source)."""
    src = os.path.join(WORK, name, "src")
    build = os.path.join(WORK, name, "build")
    shutil.rmtree(os.path.join(WORK, name), ignore_errors=True)
    os.makedirs(src)
    with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
        f.write(FAKE_PROJECT)
    with open(os.path.join(src, "hang.sh"), "w") as f:
        f.write("sleep 120\n")
    with open(os.path.join(src, "build.sh"), "w") as f:
        f.write("sleep ${BUILD_SLEEP:-0}\n")
    env = dict(os.environ, HANG_TIMEOUT=str(hang_timeout))
    subprocess.run(["cmake", "-S", src, "-B", build, "-G", "Ninja"], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return build, src


def check_env(**extra):
    """PATH with Debian's python3 first (the check imports torch for its
    CMake prefix), and an empty folder of .deb files."""
    bindir = os.path.join(WORK, "bin")
    os.makedirs(bindir, exist_ok=True)
    link = os.path.join(bindir, "python3")
    if not os.path.exists(link):
        os.symlink(PY, link)
    env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"])
    env.pop("OUT", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def gpu_check(*args, env=None, timeout=120):
    deps = os.path.join(WORK, "no-debs")
    os.makedirs(deps, exist_ok=True)
    return subprocess.run(["bash", os.path.join(SRC, "deploy", "gpu_check.sh"), "--deps", deps,
                           "--prefix", os.path.join(WORK, "prefix"), *args],
                          env=env or check_env(), capture_output=True, text=True, timeout=timeout)


def steps(out):
    with open(os.path.join(out, "steps.jsonl")) as f:
        return {json.loads(line)["step"]: json.loads(line) for line in f if line.strip()}


def read(*path):
    with open(os.path.join(*path)) as f:
        return f.read()


def report(out):
    return read(out, "gpu_report.md")


class GpuCheckArguments(unittest.TestCase):
    def test_help_lists_the_parts_and_options(self):
        r = gpu_check("--help")
        self.assertEqual(r.returncode, 0, r.stderr)
        for word in ("tests", "train", "generate", "transfer", "--budget", "--timeout", "--out", "--dry-run"):
            self.assertIn(word, r.stdout)

    def test_argument_errors_name_the_argument(self):
        cases = [(["bogus"], 'unknown argument "bogus"'),
                 (["--budget", "abc"], '--budget "abc": expected whole seconds'),
                 (["--budget", "5"], '--budget "5"'),
                 (["--budget"], "--budget needs a value"),
                 (["--timeout", "nosuch=3"], '--timeout "nosuch=3": expected STEP=SECONDS'),
                 (["--timeout", "gpu_tests=soon"], '--timeout "gpu_tests=soon"'),
                 (["tests", "--no-tests"], "nothing to run")]
        for args, message in cases:
            r = gpu_check(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(message, r.stderr, args)

    def test_dry_run_lists_each_parts_steps_with_timeouts_and_estimates(self):
        r = gpu_check("--dry-run")
        self.assertEqual(r.returncode, 0, r.stderr)
        for part in ("tests", "train", "generate", "transfer"):
            self.assertIn("part %s" % part, r.stdout)
        self.assertIn("step gpu_tests: timeout 300 s", r.stdout)
        self.assertIn("step loop: timeout 130 s", r.stdout)
        # Each part fits in 8 minutes by its own estimate.
        for line in r.stdout.splitlines():
            if line.startswith("part "):
                estimate = int(line.split("about ")[1].split(" s")[0])
                self.assertLessEqual(estimate, 480, line)
        r = gpu_check("--dry-run", "--no-bench", "--no-loop", "--timeout", "gpu_tests=42", "--eval")
        self.assertEqual([l for l in r.stdout.splitlines() if l.startswith("part ")][0][:10], "part tests")
        self.assertNotIn("part train", r.stdout)
        self.assertIn("step gpu_tests: timeout 42 s", r.stdout)
        r = gpu_check("transfer", "--dry-run", "--eval")
        self.assertIn("step loop: timeout 240 s", r.stdout)


class GpuCheckRuns(unittest.TestCase):
    def test_tests_part_reports_failed_crashed_and_timed_out_tests(self):
        build, _ = fake_tree("names")
        out = os.path.join(WORK, "names-out")
        # A configure log of a build without CUDA graphs, as a CPU LibTorch gives.
        os.makedirs(os.path.join(build, "gpu-report"))
        with open(os.path.join(build, "gpu-report", "gpu_configure.log"), "w") as f:
            f.write("-- ASymPO-RL: LibTorch without CUDA; CPU only\n")
        r = gpu_check("tests", "--build", build, "--out", out)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        s = steps(out)
        self.assertEqual(s["build"]["status"], "ok")
        self.assertEqual(s["gpu_tests"]["status"], "failed")
        self.assertNotIn("configure", s)  # the tree was configured already
        md = report(out)
        self.assertIn("5 tests, 3 failed, 1 skipped", md)
        for name, reason in (("Gpu.Fails", "Failed"), ("Gpu.Crashes", "SEGFAULT"), ("Gpu.Hangs", "Timeout")):
            self.assertIn("failed: %s (%s)" % (name, reason), md)
        self.assertNotIn("Cpu.NotAGpuTest", read(out, "gpu_tests.out"))
        facts = json.loads(read(out, "facts-tests.json"))
        self.assertEqual((facts["part"], facts["cuda_graphs_compiled"], facts["rc"]), ("tests", 0, 1))
        self.assertTrue(os.path.exists(os.path.join(out, "gpu_report.json")))

    def test_a_step_past_its_timeout_is_cut_and_recorded(self):
        build, _ = fake_tree("cut", hang_timeout=100)
        out = os.path.join(WORK, "cut-out")
        t0 = time.time()
        r = gpu_check("tests", "--build", build, "--out", out, "--timeout", "gpu_tests=3")
        self.assertLess(time.time() - t0, 40, r.stdout)
        self.assertNotEqual(r.returncode, 0)
        s = steps(out)
        self.assertEqual(s["gpu_tests"]["status"], "timed_out")
        self.assertEqual(s["gpu_tests"]["timeout_s"], 3)
        self.assertIn("| tests | gpu_tests | timed_out |", report(out))

    def test_steps_the_budget_cannot_fit_are_skipped(self):
        build, _ = fake_tree("budget")
        out = os.path.join(WORK, "budget-out")
        t0 = time.time()
        # The build leaves less than a step's minimum (20 s) of the budget.
        r = gpu_check("tests", "--build", build, "--out", out, "--budget", "60", env=check_env(BUILD_SLEEP=30))
        self.assertLess(time.time() - t0, 60, r.stdout)
        s = steps(out)
        self.assertEqual(s["build"]["status"], "ok")
        self.assertEqual(s["gpu_tests"]["status"], "skipped")
        self.assertIn("gpu_tests: skipped", r.stdout)

    def test_results_that_finished_survive_a_kill(self):
        build, src = fake_tree("kill", hang_timeout=100)
        out = os.path.join(WORK, "kill-out")
        deps = os.path.join(WORK, "no-debs")
        os.makedirs(deps, exist_ok=True)
        p = subprocess.Popen(["bash", os.path.join(SRC, "deploy", "gpu_check.sh"), "tests", "--build", build,
                              "--out", out, "--deps", deps, "--prefix", os.path.join(WORK, "prefix")],
                             env=check_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and not (os.path.exists(os.path.join(out, "steps.jsonl"))
                                                   and "build" in steps(out)):
                time.sleep(0.2)
            self.assertIn("build", steps(out))
            time.sleep(1)  # ctest is now waiting on the hanging test
        finally:
            os.killpg(p.pid, signal.SIGKILL)  # as a device call's limit kills it
            p.wait()
            subprocess.run(["pkill", "-f", os.path.join(src, "hang.sh")])
        self.assertEqual(steps(out)["build"]["status"], "ok")
        self.assertTrue(os.path.exists(os.path.join(out, "build.out")))


class GpuReport(unittest.TestCase):
    def report_tool(self, *args):
        return subprocess.run([PY, os.path.join(SRC, "deploy", "gpu_report.py"), *args],
                              capture_output=True, text=True, timeout=60)

    def test_arguments(self):
        r = self.report_tool("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("--out", r.stdout)
        self.assertEqual(self.report_tool().returncode, 2)
        r = self.report_tool(os.path.join(WORK, "absent"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a folder", r.stderr)
        r = self.report_tool(WORK, WORK)
        self.assertEqual(r.returncode, 2)
        self.assertIn("give --out", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(os.getcwd(), "--help")))

    def test_ctest_lists_with_labels_name_the_failed_tests(self):
        # ctest 3.28 on a GPU node appends each test's labels to its line in
        # the closing lists; Debian 12's ctest here does not.
        sys.path.insert(0, os.path.join(SRC, "deploy"))
        import gpu_report
        log = os.path.join(WORK, "labelled_ctest.out")
        with open(log, "w") as f:
            f.write("13/14 Test  #26: HfLogitsOnGpu .....***Failed   25.67 sec\n"
                    "93% tests passed, 2 tests failed out of 14\n\n"
                    "The following tests did not run:\n"
                    "\t 21 - Nccl.CreateFails (Skipped)\n\n"
                    "The following tests FAILED:\n"
                    "\t 26 - HfLogitsOnGpu (Failed)                            gpu\n"
                    "\t 27 - Gpu.Crashes (Subprocess aborted)     gpu unit\n"
                    "Errors while running CTest\n")
        s = gpu_report.ctest_summary(log)
        self.assertEqual(s["failed"], 2)
        self.assertEqual(s["failed_tests"], [{"name": "HfLogitsOnGpu", "reason": "Failed"},
                                             {"name": "Gpu.Crashes", "reason": "Subprocess aborted"}])

    def test_parts_from_several_machines_merge_into_one_report(self):
        tests_dir = os.path.join(WORK, "machine-a")
        build, _ = fake_tree("merge")
        gpu_check("tests", "--build", build, "--out", tests_dir)
        train_dir = os.path.join(WORK, "machine-b")
        os.makedirs(train_dir, exist_ok=True)
        with open(os.path.join(train_dir, "bench.jsonl"), "w") as f:
            for impl, tps, mfu in (("cpp", 52000.0, 0.41), ("pytorch", 40000.0, 0.31)):
                f.write(json.dumps({"mode": "train", "case": "train qwen3-0.6b", "impl": impl,
                                    "tokens_per_s": tps, "mfu": mfu}) + "\n")
        with open(os.path.join(train_dir, "steps.jsonl"), "w") as f:
            f.write(json.dumps({"part": "train", "step": "train-qwen3-0.6b-cpp", "status": "ok", "rc": 0,
                                "seconds": 21, "timeout_s": 120}) + "\n")
        with open(os.path.join(train_dir, "facts-train.json"), "w") as f:
            json.dump({"part": "train", "gpu": "NVIDIA H100 80GB HBM3"}, f)
        merged = os.path.join(WORK, "merged")
        r = self.report_tool(tests_dir, train_dir, "--out", merged, "--quiet")
        self.assertEqual(r.returncode, 0, r.stderr)
        md = report(merged)
        self.assertIn("failed: Gpu.Crashes (SEGFAULT)", md)
        self.assertIn("| train qwen3-0.6b | 52000 | 0.410 | 40000 | 0.310 | 1.30x | met |", md)
        self.assertIn("| train | train-qwen3-0.6b-cpp | ok | 21 | 120 |", md)
        self.assertIn("train: gpu NVIDIA H100 80GB HBM3", md)
        self.assertIn("tests: peak_bf16_tflops", md)
        self.assertEqual(json.loads(read(merged, "gpu_report.json"))["sources"],
                         [tests_dir, train_dir])


class ReferenceScripts(unittest.TestCase):
    def run_py(self, *args):
        return subprocess.run([PY, *args], capture_output=True, text=True, timeout=120)

    def test_they_import_and_reach_their_skip_without_a_gpu(self):
        has_cuda = self.run_py("-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)")
        if has_cuda.returncode == 0:
            self.skipTest("this machine has a GPU: the scripts run for real in the gpu tests")
        r = self.run_py(os.path.join(SRC, "tests", "reference", "hf_gpu_logits_check.py"), "x", "y")
        self.assertEqual(r.returncode, 77, r.stdout + r.stderr)
        for mode in ("train", "generate"):
            r = self.run_py(os.path.join(SRC, "bench", "gpu_model_bench.py"), "--mode", mode)
            self.assertEqual(r.returncode, 77, r.stdout + r.stderr)
        r = self.run_py(os.path.join(SRC, "bench", "gpu_model_bench.py"), "--help")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_keywords_follow_the_transformers_version(self):
        sys.path.insert(0, os.path.join(SRC, "tests", "reference"))
        from hf_compat import dtype_kwargs, rope_kwargs, save_kwargs, version_tuple
        self.assertEqual(version_tuple("5.0.0rc1"), (5, 0, 0))
        self.assertEqual(version_tuple("4.57.1"), (4, 57, 1))
        self.assertEqual(dtype_kwargs("4.46.3", "f"), {"torch_dtype": "f"})
        self.assertEqual(dtype_kwargs("4.57.1", "f"), {"dtype": "f"})
        self.assertEqual(dtype_kwargs("5.2.0", "f"), {"dtype": "f"})
        llama3 = {"rope_type": "llama3", "factor": 8.0}
        self.assertEqual(rope_kwargs("4.57.1", 5e5, llama3), {"rope_theta": 5e5, "rope_scaling": llama3})
        self.assertEqual(rope_kwargs("4.57.1", 1e6), {"rope_theta": 1e6, "rope_scaling": None})
        self.assertEqual(rope_kwargs("5.0.0", 5e5, llama3),
                         {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}})
        self.assertEqual(rope_kwargs("5.0.0", 1e6), {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
        self.assertEqual(save_kwargs("5.0.0"), {})
        self.assertEqual(save_kwargs("4.30.0"), {"safe_serialization": True})
        # No removed keyword is left in the scripts.
        for path in ("tests/reference/hf_gpu_logits_check.py", "bench/gpu_model_bench.py"):
            text = read(SRC, path)
            self.assertNotIn("safe_serialization", text, path)
            self.assertNotIn("torch_dtype", text, path)


if __name__ == "__main__":
    SRC, WORK = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    os.makedirs(WORK, exist_ok=True)
    if shutil.which("ninja") is None or not os.path.exists(PY):
        print("SKIP: needs ninja and %s" % PY)
        sys.exit(77)
    unittest.main(argv=[sys.argv[0], "-v"])
