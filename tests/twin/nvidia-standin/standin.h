/* SPDX-License-Identifier: GPL-2.0 */
/* STAND-IN character devices for molecule/gpu_devices; not NVIDIA's driver (see README.md). */
#ifndef HMK_STANDIN_H
#define HMK_STANDIN_H

#include <linux/cdev.h>
#include <linux/fs.h>
#include <linux/module.h>

/* Opening succeeds, reading gives end-of-file, writing swallows: enough for open(2) to be the test. */
static int standin_open(struct inode *inode, struct file *file) { return 0; }
static int standin_release(struct inode *inode, struct file *file) { return 0; }
static ssize_t standin_read(struct file *file, char __user *buf, size_t len, loff_t *off) { return 0; }
static ssize_t standin_write(struct file *file, const char __user *buf, size_t len, loff_t *off) { return len; }

static const struct file_operations standin_fops = {
	.owner = THIS_MODULE,
	.open = standin_open,
	.release = standin_release,
	.read = standin_read,
	.write = standin_write,
};

struct standin_region {
	const char *name;
	dev_t first;
	unsigned int count;
	struct cdev cdev;
	bool registered;
	bool added;
};

/* A fixed major when `major` is non-zero (NVIDIA's 195), a dynamic one otherwise, as the real driver does. */
static int standin_register(struct standin_region *r, unsigned int major, unsigned int minor)
{
	int rc;

	if (major) {
		r->first = MKDEV(major, minor);
		rc = register_chrdev_region(r->first, r->count, r->name);
	} else {
		rc = alloc_chrdev_region(&r->first, minor, r->count, r->name);
	}
	if (rc)
		return rc;
	r->registered = true;
	cdev_init(&r->cdev, &standin_fops);
	r->cdev.owner = THIS_MODULE;
	rc = cdev_add(&r->cdev, r->first, r->count);
	if (rc)
		return rc;
	r->added = true;
	pr_info("hmk STAND-IN: %s registered as %u:%u (%u minors)\n", r->name, MAJOR(r->first), MINOR(r->first), r->count);
	return 0;
}

static void standin_unregister(struct standin_region *r)
{
	if (r->added)
		cdev_del(&r->cdev);
	if (r->registered)
		unregister_chrdev_region(r->first, r->count);
	r->added = r->registered = false;
}

#endif
