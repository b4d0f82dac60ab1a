// SPDX-License-Identifier: GPL-2.0
/*
 * STAND-IN for NVIDIA's nvidia.ko in molecule/gpu_devices: registers the character devices NVIDIA's
 * driver registers, under the same names and major 195, and does nothing else (see README.md).
 */
#include <linux/string.h>
#include "standin.h"

#define NV_MAJOR 195

static char *naming = "r580";
module_param(naming, charp, 0444);
MODULE_PARM_DESC(naming, "r535: one nvidia-frontend region (535 branch); r580: nvidia + nvidiactl (550.40 and later)");

static struct standin_region frontend = { .name = "nvidia-frontend", .count = 256 };
static struct standin_region devices = { .name = "nvidia", .count = 248 };
static struct standin_region control = { .name = "nvidiactl", .count = 1 };
static struct standin_region caps = { .name = "nvidia-caps", .count = 8 };
static struct standin_region decoy = { .name = "hmk-standin-decoy", .count = 1 };

static void standin_exit(void)
{
	standin_unregister(&decoy);
	standin_unregister(&caps);
	standin_unregister(&control);
	standin_unregister(&devices);
	standin_unregister(&frontend);
}

static int __init standin_init(void)
{
	int rc;

	if (strcmp(naming, "r535") == 0)
		rc = standin_register(&frontend, NV_MAJOR, 0);
	else if (strcmp(naming, "r580") == 0)
		rc = standin_register(&devices, NV_MAJOR, 0) ?: standin_register(&control, NV_MAJOR, 255);
	else
		rc = -EINVAL;
	rc = rc ?: standin_register(&caps, 0, 0) ?: standin_register(&decoy, 0, 0);
	if (rc)
		standin_exit();
	return rc;
}

static void __exit standin_cleanup(void)
{
	standin_exit();
}

module_init(standin_init);
module_exit(standin_cleanup);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("STAND-IN for NVIDIA's nvidia.ko (test device names only; hybrid-moe-kit molecule/gpu_devices)");
