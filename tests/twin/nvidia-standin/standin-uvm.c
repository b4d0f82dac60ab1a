// SPDX-License-Identifier: GPL-2.0
/* STAND-IN for NVIDIA's nvidia-uvm.ko in molecule/gpu_devices: the "nvidia-uvm" region only (see README.md). */
#include "standin.h"

static struct standin_region uvm = { .name = "nvidia-uvm", .count = 2 };

static int __init standin_uvm_init(void)
{
	int rc = standin_register(&uvm, 0, 0);

	if (rc)
		standin_unregister(&uvm);
	return rc;
}

static void __exit standin_uvm_exit(void)
{
	standin_unregister(&uvm);
}

module_init(standin_uvm_init);
module_exit(standin_uvm_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("STAND-IN for NVIDIA's nvidia-uvm.ko (test device names only; hybrid-moe-kit molecule/gpu_devices)");
