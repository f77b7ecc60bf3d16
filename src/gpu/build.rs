//! The one place a policy is put on a device: from (allocator, conf, capacity, backend, address
//! source) to a ready policy. The simulated device gets its adaptors here (address replay when
//! the input recorded addresses, device time with `--sim-latency`).
//!
//! Two typed shortcuts stay outside [`build`], both for a reason: [`pytorch_on_sim`] gives the
//! analyses' many replays (`advise`, the capacity search) a statically dispatched policy, and the
//! fidelity check composes its adaptors itself to read the address-replay misses.

use super::async_pool::AsyncPoolAllocator;
use super::baseline::{IdealAllocator, NoCacheAllocator};
use super::caching::CachingAllocator;
use super::config::AllocatorConfig;
use super::device::address_replay::AddressReplay;
use super::device::latency::WithLatency;
use super::device::withheld::Withheld;
use super::device::{AddressOrder, Device, SimDevice, H100_CAPACITY_BYTES};
use super::devprobe::LatencyModel;
use super::GpuAllocator;
use crate::error::InputError;
use crate::results::{Backend, GpuPolicy};

/// The device a policy runs on.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    pub backend: Backend,
    /// Device memory (`None`: an H100 80 GB card on the simulator, the real size on a GPU).
    pub capacity: Option<u64>,
    /// cudaMalloc `(address, size)`s a real GPU returned, replayed in order (simulator only).
    pub addresses: Vec<(u64, u64)>,
    /// Device-call latencies to account device time with (simulator only, `--sim-latency` /
    /// `--latency`); without one the modelled allocator time uses the embedded H100 table.
    pub latency: Option<LatencyModel>,
    /// Where the simulated device places cudaMallocs (simulator only, `--address-order`).
    pub address_order: AddressOrder,
    /// Bytes of the card the allocator cannot get, held outside it (the CUDA context, NCCL's
    /// buffers: [`super::card::Outside`]; simulator only). A memory fraction still counts from
    /// the whole card, as PyTorch's allowed_memory_maximum does.
    pub withheld: u64,
}

impl DeviceSpec {
    /// A plain simulated device of `capacity` bytes.
    pub fn sim(capacity: u64) -> Self {
        DeviceSpec { backend: Backend::Sim, capacity: Some(capacity), addresses: Vec::new(), latency: None, address_order: AddressOrder::Lowest, withheld: 0 }
    }
}

/// A policy on its device, with the backend and capacity it got.
pub struct Built {
    pub alloc: Box<dyn GpuAllocator>,
    pub backend: Backend,
    pub capacity: u64,
    /// The time model the simulated device charges (`None` on a real GPU, which measures).
    pub time_model: Option<LatencyModel>,
    /// Whether the device time is the user's to see (`device_time_s`): measured on a GPU, or
    /// asked for with a latency file; the embedded default only feeds `modelled_alloc_time_s`.
    pub reports_device_time: bool,
}

/// Builds `policy` (with `conf` for pytorch) on the device `spec` names.
pub fn build(policy: GpuPolicy, conf: &AllocatorConfig, spec: &DeviceSpec) -> Result<Built, InputError> {
    use super::cuda::CudaDevice;
    match spec.backend {
        Backend::Sim => {
            let capacity = spec.capacity.unwrap_or(H100_CAPACITY_BYTES);
            let model = spec.latency.clone().unwrap_or_else(LatencyModel::h100);
            let alloc = on_device(policy, conf, sim_device(capacity, spec, &model), capacity)?;
            Ok(Built { alloc, backend: Backend::Sim, capacity, time_model: Some(model), reports_device_time: spec.latency.is_some() })
        }
        Backend::Cuda => {
            if spec.capacity.is_some() {
                return Err(InputError::new("--capacity", "a real GPU has the capacity it has: use per_process_memory_fraction in --conf to cap it"));
            }
            let device = CudaDevice::open(0)?;
            let capacity = device.capacity();
            let alloc = on_device(policy, conf, device, capacity)?;
            Ok(Built { alloc, backend: Backend::Cuda, capacity, time_model: None, reports_device_time: true })
        }
    }
}

/// The registry of constructors: `policy` over `device`, whatever the device is.
fn on_device<D: PolicyDevice>(policy: GpuPolicy, conf: &AllocatorConfig, device: D, capacity: u64) -> Result<Box<dyn GpuAllocator>, InputError> {
    Ok(match policy {
        GpuPolicy::Pytorch => Box::new(CachingAllocator::new(conf.clone(), device)),
        GpuPolicy::Nocache => Box::new(NoCacheAllocator::new(device)),
        GpuPolicy::Ideal => Box::new(IdealAllocator::new(capacity)),
        GpuPolicy::Async => device.async_pool()?,
    })
}

/// A device a policy can be built on. Only a real GPU has CUDA's own pool.
trait PolicyDevice: Device + 'static {
    fn async_pool(self) -> Result<Box<dyn GpuAllocator>, InputError>;
}

impl PolicyDevice for Box<dyn Device> {
    fn async_pool(self) -> Result<Box<dyn GpuAllocator>, InputError> {
        Err(InputError::new("--allocator", "the async pool is CUDA's own allocator: it needs --device cuda"))
    }
}

impl PolicyDevice for super::cuda::CudaDevice {
    fn async_pool(self) -> Result<Box<dyn GpuAllocator>, InputError> {
        Ok(Box::new(AsyncPoolAllocator::new(self).map_err(|e| InputError::new("--device cuda", e.to_string()))?))
    }
}

/// The simulated device with the adaptors `spec` asks for; device calls are always priced
/// (`model`), for the modelled allocator time.
fn sim_device(capacity: u64, spec: &DeviceSpec, model: &LatencyModel) -> Box<dyn Device> {
    let sim = SimDevice::new(capacity).with_address_order(spec.address_order);
    let mut device: Box<dyn Device> = if spec.addresses.is_empty() { Box::new(sim) } else { Box::new(AddressReplay::new(sim, spec.addresses.clone())) };
    if spec.withheld > 0 {
        device = Box::new(Withheld::new(device, spec.withheld));
    }
    Box::new(WithLatency::new(device, model.clone()))
}

/// PyTorch's policy on a simulated device whose calls `model` prices, statically dispatched.
/// `withheld` bytes of the card are held outside the allocator (see [`DeviceSpec::withheld`]).
pub fn pytorch_on_sim(
    conf: &AllocatorConfig,
    capacity: u64,
    withheld: u64,
    model: &LatencyModel,
    addresses: &[(u64, u64)],
) -> CachingAllocator<WithLatency<Withheld<AddressReplay>>> {
    // The recorded cudaMalloc addresses as `build` replays them, so an analysis of a snapshot
    // breaks best-fit ties as `replay` of it does (an empty script places as the device does).
    let device = Withheld::new(AddressReplay::new(SimDevice::new(capacity), addresses.to_vec()), withheld);
    CachingAllocator::new(conf.clone(), WithLatency::new(device, model.clone()))
}
