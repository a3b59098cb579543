# Finds what the Python package needs, from the top-level CMakeLists.txt: an interpreter that imports
# mpi4py (its C API builds the communicator bridge), its development files, and pybind11. Sets
#   WB_HAVE_PYTHON              ON when python/ is built
#   WB_PYTHON_EXECUTABLE        the interpreter the package is built for and the tests run with
#   WB_PYTHON_SKIP_REASON       why python/ is not built, or why its tests are skipped (no torch)
#   WB_PYTHON_HAS_TORCH         ON when that interpreter imports torch (the tests need it)
#
# Which interpreter: Python3_EXECUTABLE when given; otherwise the first of /usr/bin/python3 and the python3
# on PATH that imports both torch and mpi4py, else the first that imports mpi4py. On Debian machines the
# python3 first on PATH may be a separate (pyenv) interpreter that sees none of Debian's python3-torch and
# python3-mpi4py, which is why /usr/bin/python3 comes first.

set(WB_HAVE_PYTHON OFF)
set(WB_PYTHON_HAS_TORCH OFF)
set(WB_PYTHON_EXECUTABLE "")
set(WB_PYTHON_SKIP_REASON "")

function(_wb_probe_python interpreter out)
  # Prints: python version;mpi4py version or -;torch version or -;numpy version or -;mpi4py include dir
  set(script [=[
import sys
def version(name):
    try:
        return __import__(name).__version__
    except Exception:
        return "-"
include = "-"
try:
    import mpi4py
    include = mpi4py.get_include()
except Exception:
    pass
print(chr(59).join(["%d.%d.%d" % sys.version_info[:3], version("mpi4py"), version("torch"), version("numpy"), include]), end="")
]=])
  execute_process(COMMAND ${interpreter} -c "${script}" OUTPUT_VARIABLE probed RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 120)
  if(NOT rc EQUAL 0)
    set(probed "")
  endif()
  set(${out} "${probed}" PARENT_SCOPE)
endfunction()

macro(_wb_python_done reason)
  set(WB_PYTHON_SKIP_REASON "${reason}")
  message(STATUS "WeightBridge: not building the Python package: ${reason}")
endmacro()

if(WB_PYTHON STREQUAL "OFF")
  _wb_python_done("WB_PYTHON=OFF")
else()
  set(_wb_candidates)
  if(Python3_EXECUTABLE)
    list(APPEND _wb_candidates ${Python3_EXECUTABLE})
  else()
    if(EXISTS /usr/bin/python3)
      list(APPEND _wb_candidates /usr/bin/python3)
    endif()
    find_program(_wb_path_python3 NAMES python3 NO_CACHE)
    if(_wb_path_python3)
      list(APPEND _wb_candidates ${_wb_path_python3})
    endif()
  endif()
  set(_wb_chosen "")
  set(_wb_chosen_probe "")
  set(_wb_tried "")
  foreach(candidate IN LISTS _wb_candidates)
    _wb_probe_python(${candidate} probe)
    list(LENGTH probe fields)
    if(NOT fields EQUAL 5)
      string(APPEND _wb_tried " ${candidate} (does not run)")
      continue()
    endif()
    list(GET probe 1 mpi4py_version)
    list(GET probe 2 torch_version)
    string(APPEND _wb_tried " ${candidate} (mpi4py ${mpi4py_version}, torch ${torch_version})")
    if(mpi4py_version STREQUAL "-")
      continue()
    endif()
    if(NOT torch_version STREQUAL "-")
      set(_wb_chosen ${candidate})
      set(_wb_chosen_probe "${probe}")
      break()
    elseif(NOT _wb_chosen)
      set(_wb_chosen ${candidate})
      set(_wb_chosen_probe "${probe}")
    endif()
  endforeach()

  if(NOT _wb_chosen)
    _wb_python_done("no interpreter imports mpi4py (tried:${_wb_tried}; install python3-mpi4py or set Python3_EXECUTABLE)")
  else()
    set(Python3_EXECUTABLE ${_wb_chosen})  # FindPython takes the interpreter from this hint
    find_package(Python3 3.8 COMPONENTS Interpreter Development.Module)
    find_package(pybind11 2.6 CONFIG QUIET)
    list(GET _wb_chosen_probe 0 _wb_python_version)
    if(NOT Python3_Development.Module_FOUND)
      _wb_python_done("no Python development files for ${_wb_chosen} ${_wb_python_version} (install python3-dev)")
    elseif(NOT Python3_VERSION VERSION_EQUAL _wb_python_version)
      _wb_python_done("FindPython found Python ${Python3_VERSION}, not ${_wb_chosen} ${_wb_python_version}")
    elseif(NOT pybind11_FOUND)
      _wb_python_done("pybind11 not found (install pybind11-dev)")
    else()
      set(WB_HAVE_PYTHON ON)
      set(WB_PYTHON_EXECUTABLE ${_wb_chosen})
      list(GET _wb_chosen_probe 1 _wb_mpi4py)
      list(GET _wb_chosen_probe 2 _wb_torch)
      list(GET _wb_chosen_probe 3 _wb_numpy)
      list(GET _wb_chosen_probe 4 WB_MPI4PY_INCLUDE_DIR)
      if(_wb_torch STREQUAL "-")
        set(WB_PYTHON_SKIP_REASON "${_wb_chosen} cannot import torch (install python3-torch); the Python tests need it")
      else()
        set(WB_PYTHON_HAS_TORCH ON)
      endif()
      message(STATUS "WeightBridge: Python package for ${_wb_chosen} (Python ${_wb_python_version}; mpi4py ${_wb_mpi4py}, "
                     "torch ${_wb_torch}, numpy ${_wb_numpy}; pybind11 ${pybind11_VERSION})")
      if(NOT WB_PYTHON_HAS_TORCH)
        message(STATUS "WeightBridge: the Python tests will be skipped: ${WB_PYTHON_SKIP_REASON}")
      endif()
    endif()
  endif()
  if(WB_PYTHON STREQUAL "ON" AND NOT WB_HAVE_PYTHON)
    message(FATAL_ERROR "WB_PYTHON=ON but the Python package cannot be built: ${WB_PYTHON_SKIP_REASON}")
  endif()
endif()
