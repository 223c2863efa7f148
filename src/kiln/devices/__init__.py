"""The devices a machine has, and which device an action's result belongs to.

identity.py  the host CPU and each IREE runtime driver's devices, their
             identities (the part of a check's key that says which device
             measured it), what an action needs (``needs=``, or derived from its
             compile target) and whether a machine has it
details.py   a CPU's model and instruction-set extensions (``/proc/cpuinfo``, read
             once), and which ``nvidia-smi`` row is which runtime device
"""
