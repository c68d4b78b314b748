"""Runner of torch's own distributed tests (torch/testing/_internal/distributed/distributed_test.py,
the collective and DDP tests of the installed wheel) on the gradswitch backend, CPU, against a local
gradswitchd it starts. docs/torch_upstream.md: the command, what the runner changes in the harness and
the latest listing with the reason of every skip and failure.

    python -m tests.torch_upstream                      # everything (long: see docs/torch_upstream.md)
    python -m tests.torch_upstream -k get_future -k 'test_all_reduce_sum*'
    python -m tests.torch_upstream --help
"""
