"""glibc's allocator keeps a CPU run's freed activations in its heap, unless the user chose otherwise."""

import subprocess
import sys

import pytest

from conftest import REPO
from image_classification.system import host_memory

glibc = pytest.mark.skipif(host_memory.allocator_choice() == "not glibc", reason="glibc's allocator only")

# A process of its own (the settings are process-wide): a 24 MiB block, above glibc's first threshold of 128 KiB,
# is it mapped from the kernel while held, and does the heap keep it once freed?
PROBE = """
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from image_classification.system import host_memory
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype, libc.malloc.restype = Info, ctypes.c_void_p
libc.malloc.argtypes, libc.free.argtypes = (ctypes.c_size_t,), (ctypes.c_void_p,)
made = host_memory.keep_freed_memory()
size = 24 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
mapped = libc.mallinfo2().hblkhd
libc.free(block)
print(made, mapped >= size, libc.mallinfo2().arena >= size)
"""


def probe(env: dict) -> str:
    return subprocess.run([sys.executable, "-c", PROBE, str(REPO)], capture_output=True, text=True, check=True,
                          env=env).stdout.split()


@glibc
def test_a_freed_block_stays_in_the_heap_for_the_next_step():
    made, mapped, kept = probe({"PATH": "/usr/bin:/bin"})
    assert (made, mapped, kept) == ("True", "False", "True")  # from the heap, and still there once freed


@glibc
def test_the_users_own_malloc_settings_are_left_alone():
    made, mapped, kept = probe({"PATH": "/usr/bin:/bin", "MALLOC_ARENA_MAX": "2"})
    assert (made, mapped, kept) == ("False", "True", "False")  # glibc's default: mapped, and given back


@glibc
def test_the_users_own_glibc_malloc_tunables_are_left_alone():
    """mallopt would override what GLIBC_TUNABLES set; a tunable of glibc's allocator is the user's choice."""
    made, mapped, kept = probe({"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert (made, mapped, kept) == ("False", "True", "False")


def test_only_the_allocator_s_tunables_count_as_the_user_s_choice(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "system", lambda: "Linux")
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    for name in [name for name in host_memory.os.environ if name.startswith("MALLOC_")] + ["LD_PRELOAD"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=2048:glibc.cpu.hwcaps=-AVX512F")
    assert host_memory.allocator_choice() is None
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX512F:glibc.malloc.mmap_threshold=65536")
    assert host_memory.allocator_choice() == "glibc.malloc.mmap_threshold set"


def test_what_leaves_the_allocator_alone_is_said(monkeypatch):
    monkeypatch.setattr(host_memory.platform, "system", lambda: "Linux")
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("glibc", "2.36"))
    for name in [name for name in host_memory.os.environ if name.startswith("MALLOC_")] + ["LD_PRELOAD",
                                                                                         "GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    assert host_memory.allocator_choice() is None
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert host_memory.allocator_choice() == "another allocator is preloaded"
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert host_memory.allocator_choice() == "MALLOC_TRIM_THRESHOLD_ set"
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("", ""))
    assert host_memory.allocator_choice() == "not glibc" and host_memory.keep_freed_memory() is False
