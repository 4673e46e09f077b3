"""The execute seam. `runner` is the parent side (no torch); `child` is the only module that imports a
submission; `trusted` computes references and judges outputs in a process that never imports one."""
