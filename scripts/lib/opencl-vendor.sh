# shellcheck shell=bash
# Sourced by the OpenCL scripts: which OpenCL vendors a program sees.
#   served_env_for [VENDOR]   sets the array served_env to the env(1) words that show a program
#                             VENDOR alone (a .icd file or a library), through both ICD loaders'
#                             variables (ocl-icd reads OCL_ICD_VENDORS, the Khronos loader
#                             OCL_ICD_FILENAMES); without VENDOR, every platform the loader finds.
# shellcheck disable=SC2034  # served_env is read by the scripts that source this
served_env_for() {
  local vendor=${1:-}
  case "$vendor" in
    "") served_env=(-u OCL_ICD_VENDORS -u OCL_ICD_FILENAMES) ;;
    *.icd) served_env=("OCL_ICD_VENDORS=$vendor" "OCL_ICD_FILENAMES=$(sed -n 1p "$vendor")") ;;
    *) served_env=("OCL_ICD_VENDORS=$vendor" "OCL_ICD_FILENAMES=$vendor") ;;
  esac
}
