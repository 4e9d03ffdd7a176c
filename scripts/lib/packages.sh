# Debian packages the CI scripts need, installed only when missing. Source it, fill the array
# `need` (need_opencl adds what OpenCL through Debian's ICD loader needs), then install_need.

# Appends to `need` the missing parts of OpenCL through the ICD loader: the headers, the loader
# (with libOpenCL.so to link), PoCL's CPU device, clinfo and a C compiler.
need_opencl() {
  [ -e /usr/include/CL/cl.h ] || need+=(opencl-c-headers)
  [ -e /usr/lib/x86_64-linux-gnu/libOpenCL.so ] || ldconfig -p | grep -q 'libOpenCL.so ' || need+=(ocl-icd-opencl-dev)
  ls /etc/OpenCL/vendors/*pocl* >/dev/null 2>&1 || need+=(pocl-opencl-icd)
  command -v clinfo >/dev/null || need+=(clinfo)
  command -v cc >/dev/null || need+=(gcc)
}

# Installs the packages in `need`, if any (apt-get; through sudo when not root).
install_need() {
  [ ${#need[@]} -gt 0 ] || return 0
  echo "installing ${need[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need[@]}" >/dev/null
}
