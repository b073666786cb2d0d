"""A client this project did not write: Python gRPC (Debian's python3-grpcio)
with stubs generated from proto/ by grpc_tools, against a running
asympo-learner. Submits valid and invalid batches, streams, reads status.

    python3 python_client_test.py PROTO_DIR LEARNER_BINARY WORK_DIR
Exit 0 on success, 1 on a failed check, 77 when grpc/grpc_tools are missing.
"""
import os
import signal
import subprocess
import sys

from learner_client import check, free_port, generate_stubs, grpc


def main():
    proto_dir, binary, work = sys.argv[1], sys.argv[2], sys.argv[3]
    learner_pb2, learner_pb2_grpc, rollout_pb2 = generate_stubs(proto_dir, work)

    port = free_port()
    log = open(os.path.join(work, "learner.log"), "w")
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:%d" % port, "--metrics_address=",
                             "--prompts_per_step=1000", "--queue_capacity=1000",
                             "--max_groups_per_batch=10", "--full_queue_timeout=1s"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        channel = grpc.insecure_channel("127.0.0.1:%d" % port)
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = learner_pb2_grpc.LearnerStub(channel)

        status = stub.GetStatus(learner_pb2.GetStatusRequest())
        check(status.objective == "asympo" and not status.wants_behavior_logprobs, "GetStatus")
        vocab = status.limits.vocab_size

        def group(pid, rewards, token=5):
            return rollout_pb2.PromptGroup(prompt_id=pid, prompt_tokens=[1, 2, 3], responses=[
                rollout_pb2.Response(tokens=[token, 6, 0], reward=r) for r in rewards])

        reply = stub.Submit(rollout_pb2.RolloutBatch(source="python", groups=[
            group("a", [1.0, 0.0, 0.5]), group("b", [0.0, 0.0])]))
        check(reply.accepted_groups == 2 and reply.accepted_responses == 5, "valid batch accepted")

        bad = [
            (rollout_pb2.RolloutBatch(groups=[group("c", [1.0])]), "group has 1 responses"),
            (rollout_pb2.RolloutBatch(groups=[group("d", [1.0, float("nan")])]), "reward is nan"),
            (rollout_pb2.RolloutBatch(groups=[group("e", [1.0, 0.0], token=vocab)]),
             "outside the vocabulary"),
            (rollout_pb2.RolloutBatch(groups=[]), "batch has no groups"),
        ]
        for batch, message in bad:
            try:
                stub.Submit(batch)
                check(False, "invalid batch rejected: " + message)
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.details(),
                      "invalid batch rejected with '%s'" % message)

        summary = stub.SubmitStream(iter([rollout_pb2.RolloutBatch(groups=[group("s%d" % i, [1.0, 0.0])])
                                          for i in range(5)]))
        check(summary.accepted_batches == 5 and summary.accepted_groups == 5, "stream of 5 batches")

        status = stub.GetStatus(learner_pb2.GetStatusRequest())
        check(status.queue_depth_groups == 7 and status.rejected_invalid_batches == 4 and
              status.accepted_batches == 6, "status counts: 7 queued, 4 rejected, 6 accepted")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        log.close()
    check(code == 0, "learner exits cleanly on SIGTERM")
    with open(os.path.join(work, "learner.log")) as f:
        check("7 queued groups were left untrained" in f.read(), "shutdown reports untrained groups")


if __name__ == "__main__":
    main()
