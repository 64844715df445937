"""Vulkan's device-local memory (VK_EXT_memory_budget's budget where the driver has it) of the first GPU, as JSON.

Run as ``python -m anyformer.machine._vulkan_budget`` by ``_gpu_memory.from_vulkan`` in a child
process: a broken driver can abort the process that creates a Vulkan instance. Only ctypes and the
system's Vulkan loader (``libvulkan.so.1``, ``vulkan-1.dll``, ``libvulkan.1.dylib``): no binding to
install. CPU devices (lavapipe, SwiftShader) are skipped unless ``ANYFORMER_SOFTWARE_GPU=1``, as the
adapter probe skips them. Prints ``{}`` where no device answers; ``free`` is null without the extension.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import struct
import sys
from typing import Any

_INSTANCE_CREATE_INFO = 1
_APPLICATION_INFO = 0
_MEMORY_PROPERTIES_2 = 1000059006
_MEMORY_BUDGET_PROPERTIES = 1000237000
_API_1_1 = (1 << 22) | (1 << 12)
_DEVICE_TYPE_CPU = 4
_HEAP_DEVICE_LOCAL = 0x1
_MAX_HEAPS = 16
_BUDGET_EXTENSION = b"VK_EXT_memory_budget"


class _ApplicationInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("pApplicationName", ctypes.c_char_p),
        ("applicationVersion", ctypes.c_uint32),
        ("pEngineName", ctypes.c_char_p),
        ("engineVersion", ctypes.c_uint32),
        ("apiVersion", ctypes.c_uint32),
    ]


class _InstanceCreateInfo(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("flags", ctypes.c_uint32),
        ("pApplicationInfo", ctypes.POINTER(_ApplicationInfo)),
        ("enabledLayerCount", ctypes.c_uint32),
        ("ppEnabledLayerNames", ctypes.c_void_p),
        ("enabledExtensionCount", ctypes.c_uint32),
        ("ppEnabledExtensionNames", ctypes.c_void_p),
    ]


class _MemoryHeap(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64), ("flags", ctypes.c_uint32)]


class _MemoryProperties(ctypes.Structure):
    _fields_ = [
        ("memoryTypeCount", ctypes.c_uint32),
        ("memoryTypes", ctypes.c_uint32 * 64),  # 32 x {propertyFlags, heapIndex}
        ("memoryHeapCount", ctypes.c_uint32),
        ("memoryHeaps", _MemoryHeap * _MAX_HEAPS),
    ]


class _BudgetProperties(ctypes.Structure):
    _fields_ = [
        ("sType", ctypes.c_int),
        ("pNext", ctypes.c_void_p),
        ("heapBudget", ctypes.c_uint64 * _MAX_HEAPS),
        ("heapUsage", ctypes.c_uint64 * _MAX_HEAPS),
    ]


class _MemoryProperties2(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("memoryProperties", _MemoryProperties)]


class _ExtensionProperties(ctypes.Structure):
    _fields_ = [("extensionName", ctypes.c_char * 256), ("specVersion", ctypes.c_uint32)]


def _loader() -> Any:
    names = {"win32": ["vulkan-1.dll"], "darwin": ["libvulkan.1.dylib", "libMoltenVK.dylib"]}.get(
        sys.platform, ["libvulkan.so.1"]
    )
    for name in [*names, ctypes.util.find_library("vulkan")]:
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
    return None


def _has_budget_extension(vk: Any, device: ctypes.c_void_p) -> bool:
    count = ctypes.c_uint32()
    vk.vkEnumerateDeviceExtensionProperties(device, None, ctypes.byref(count), None)
    extensions = (_ExtensionProperties * count.value)()
    vk.vkEnumerateDeviceExtensionProperties(device, None, ctypes.byref(count), extensions)
    return any(e.extensionName == _BUDGET_EXTENSION for e in extensions[: count.value])


def _device_facts(vk: Any, instance: ctypes.c_void_p, device: ctypes.c_void_p) -> dict[str, Any] | None:
    # VkPhysicalDeviceProperties is large (its limits); only its head is read: apiVersion, driverVersion,
    # vendorID, deviceID, deviceType (4-byte fields) and deviceName[256].
    properties = ctypes.create_string_buffer(4096)
    vk.vkGetPhysicalDeviceProperties(device, properties)
    device_type = struct.unpack_from("<i", properties.raw, 16)[0]
    name = properties.raw[20:276].split(b"\0", 1)[0].decode(errors="replace")
    if device_type == _DEVICE_TYPE_CPU and os.environ.get("ANYFORMER_SOFTWARE_GPU") != "1":
        return None
    vk.vkGetInstanceProcAddr.restype = ctypes.c_void_p
    address = vk.vkGetInstanceProcAddr(instance, b"vkGetPhysicalDeviceMemoryProperties2")
    if not address:
        return None
    get_properties2 = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(address)
    # Without the budget extension the heaps' sizes are still known, what is free is not.
    with_budget = _has_budget_extension(vk, device)
    budget = _BudgetProperties(sType=_MEMORY_BUDGET_PROPERTIES)
    memory = _MemoryProperties2(sType=_MEMORY_PROPERTIES_2)
    if with_budget:
        memory.pNext = ctypes.cast(ctypes.pointer(budget), ctypes.c_void_p)
    get_properties2(device, ctypes.byref(memory))
    heaps = memory.memoryProperties
    count = min(heaps.memoryHeapCount, _MAX_HEAPS)
    local = [i for i in range(count) if heaps.memoryHeaps[i].flags & _HEAP_DEVICE_LOCAL]
    total = sum(heaps.memoryHeaps[i].size for i in local)
    free = sum(max(budget.heapBudget[i] - budget.heapUsage[i], 0) for i in local) if with_budget else None
    return {"device": name, "total": int(total), "free": None if free is None else int(free)} if total else None


def budget() -> dict[str, Any]:
    """The first GPU's name, device-local total and free bytes, else an empty dict."""
    vk = _loader()
    if vk is None:
        return {}
    app = _ApplicationInfo(sType=_APPLICATION_INFO, pApplicationName=b"anyformer", apiVersion=_API_1_1)
    info = _InstanceCreateInfo(sType=_INSTANCE_CREATE_INFO, pApplicationInfo=ctypes.pointer(app))
    instance = ctypes.c_void_p()
    if vk.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return {}
    try:
        count = ctypes.c_uint32()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
        devices = (ctypes.c_void_p * count.value)()
        vk.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), devices)
        for device in devices[: count.value]:
            facts = _device_facts(vk, instance, ctypes.c_void_p(device))
            if facts is not None:
                return facts
        return {}
    finally:
        vk.vkDestroyInstance(instance, None)


if __name__ == "__main__":
    print(json.dumps(budget()))
