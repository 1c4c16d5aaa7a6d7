# Compiler warnings of the project's own targets: -Wall -Wextra always (the host compiler's, for nvcc-compiled
# files too), -Werror with SINKATTN_WARNINGS_AS_ERRORS (CI: tools/test.sh), so that a new warning fails the build
# where it is introduced. Only targets defined in this source tree get them: imported packages (GoogleTest, CLI11,
# nlohmann-json, jaxlib's and PyTorch's headers, included as SYSTEM) and anything added from outside the tree keep
# their own flags.
#
# nvcc: -Xcompiler passes the flags to the host compiler (host code and nvcc's generated host stubs);
# --Werror=all-warnings makes nvcc's own warnings (its front end's, e.g. #177-D, a variable never referenced, in
# device code too) errors as well. ptxas's register report (-Xptxas=-v, spills) is not a warning: build/ptxas.log and
# the CTest ptxas_spills judge it.
option(SINKATTN_WARNINGS_AS_ERRORS "Treat compiler warnings of sinkattn's own targets as errors (CI)" OFF)

# The targets of directory `dir` and of its subdirectories inside the source tree, into `out`.
function(_sinkattn_own_targets dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    cmake_path(IS_PREFIX PROJECT_SOURCE_DIR "${sub}" NORMALIZE inside)
    cmake_path(IS_PREFIX PROJECT_BINARY_DIR "${sub}" NORMALIZE in_build)
    if(inside AND NOT in_build)
      _sinkattn_own_targets("${sub}" sub_targets)
      list(APPEND targets ${sub_targets})
    endif()
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

# Adds the warning flags to every compiled target of the source tree; called once, after every add_subdirectory.
function(sinkattn_enable_warnings)
  set(cxx -Wall -Wextra)
  # GCC 12's -Wrestrict reports impossible overlaps inside libstdc++'s std::string when an assignment of a short
  # literal or a concatenation is inlined at -O3 (GCC bugs 105329, 105651: `value = "1"` in a test, `(i ? "," : "")
  # + s`): noise of the whole category there, whatever the code, so it is off for GCC before 13.
  list(APPEND cxx $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>)
  set(cuda -Xcompiler=-Wall,-Wextra)
  if(SINKATTN_WARNINGS_AS_ERRORS)
    list(APPEND cxx -Werror)
    list(APPEND cuda -Xcompiler=-Werror --Werror=all-warnings)
  endif()
  _sinkattn_own_targets("${PROJECT_SOURCE_DIR}" targets)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|STATIC_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY)$")
      target_compile_options(${t} PRIVATE "$<$<COMPILE_LANGUAGE:CXX,C>:${cxx}>"
                                          "$<$<COMPILE_LANGUAGE:CUDA>:${cuda}>")
    endif()
  endforeach()
endfunction()
