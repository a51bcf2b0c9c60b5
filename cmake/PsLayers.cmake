# ps_add_layer(NAME DIR SOURCES...): one layer of the core library, a static
# library `ps_<NAME>` (exported and aliased as ps::<NAME>) built from
# src/<DIR>/. Its headers are included as "<DIR>/x.h" through an include
# root of its own, ${PROJECT_BINARY_DIR}/layers/<NAME>/, which holds one
# link: <DIR> -> src/<DIR>. The root is PUBLIC (in the build tree only), so a
# layer sees its own headers and those of the layers it links, and an
# include of a layer it does not link is "No such file" at compile time.
# More than one layer may share a DIR only if each links the others.
function(ps_add_layer name dir)
  set(target ps_${name})
  add_library(${target} STATIC ${ARGN})
  add_library(ps::${name} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  ps_set_warnings(${target})
  set(root ${PROJECT_BINARY_DIR}/layers/${name})
  file(MAKE_DIRECTORY ${root})
  if(NOT EXISTS ${root}/${dir})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${dir} ${root}/${dir} SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>)
  install(TARGETS ${target} EXPORT psTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
endfunction()
