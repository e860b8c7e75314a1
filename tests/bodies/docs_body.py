"""msrun body for docs blocks marked ``# msrun: N workers``: run one block's source as a script."""
import os
import sys
import tempfile
import types

from tests.doc_blocks import ROOT


def run_block(block_id, source):
    """Exec ``source`` (written to a file) in a fresh namespace in a scratch directory (shared by the ranks, with the
    repository's configs/ linked in); return the names it defined. Model-parallel state is reset after."""
    from mindformers_core.distributed import destroy_model_parallel
    cwd = os.getcwd()
    scratch = os.path.join(tempfile.gettempdir(), f"mfc_docs_{os.getppid()}", block_id.replace("/", "_"))
    os.makedirs(scratch, exist_ok=True)
    link = os.path.join(scratch, "configs")
    if not os.path.exists(link):
        try:
            os.symlink(os.path.join(ROOT, "configs"), link)
        except FileExistsError:
            pass
    # a real file (ms.jit reads its functions' source), padded so tracebacks show the doc's line numbers
    doc, line = block_id.rsplit(":", 1)
    script = os.path.join(scratch, os.path.basename(doc).replace(".md", f"_md_{line}.py"))
    with open(script, "w", encoding="utf-8") as f:
        f.write("\n" * int(line) + source)
    # a registered module: ms.jit resolves a function's globals through sys.modules[fn.__module__]
    module = types.ModuleType(f"docs_block_{os.path.basename(script)[:-3]}")
    module.__file__ = script
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    _wait_for_every_rank()
    os.chdir(scratch)
    try:
        with open(script, encoding="utf-8") as f:
            code = compile(f.read(), script, "exec")
        exec(code, namespace)
        _wait_for_every_rank()
    finally:
        os.chdir(cwd)
        destroy_model_parallel()
    return sorted(k for k in namespace if not k.startswith("__"))


def _wait_for_every_rank():
    """Ranks enter and leave a block together: the next block may reuse a group (same ranks, same cached
    communicator) that a slower rank is still using for this block's last collectives."""
    import mindspore as ms
    from mindformers_core.distributed import get_env, is_initialized
    from mindformers_core.distributed.comm.functional import barrier
    ms.runtime.synchronize()
    if is_initialized() and get_env().world_size > 1:
        barrier()
