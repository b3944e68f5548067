import pytest


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny models: intra-op threads cost more in start-up and spinning than they save in
    # math (the Wan parity file ran 5x longer with 2 threads on a shared 2-core machine).
    import torch

    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)
